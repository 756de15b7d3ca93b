"""The optimizer of the recipes (SGD, RMSprop, TF's RMSprop) and its parameter groups (which parameters are
decayed: recipe.weight_decay_on)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, TypeVar, cast

import torch
from timm.optim import RMSpropTF as TimmRMSpropTF
from timm.optim import param_groups_weight_decay
from torch import nn

from imgcls.config.choices import OPTIMIZERS
from imgcls.training.rmsprop_tf import RMSpropTF, flat_views


def parameter_groups(net: nn.Module, weight_decay: float, decayed: str = "conv_and_linear_weights") -> list[dict]:
    """The trainable parameters in two groups, decayed and not, by `decayed` (recipe.weight_decay_on):

    - conv_and_linear_weights: every parameter of 2+ dimensions (conv and linear weights); no norm weights or
      biases. Chosen by parameter kind, not by a substring of its name: NVIDIA PyTorch's `"bn" in name` test
      missed the ResNet downsample BN (`downsample.1`).
    - all_but_norm: NVIDIA TF1's set (model/resnet.py loss_filter_fn), biases decayed.
    - all_but_norm_and_depthwise: NVIDIA TF2 EfficientNet's set, the tensors its Keras layers regularize: the
      kernel_regularizer it also hands DepthwiseConv2D is never read there (that layer reads
      depthwise_regularizer), so depthwise kernels go undecayed.
    - all: every parameter (NVIDIA PyTorch --bn-weight-decay)."""
    if decayed == "all":
        return [{"params": [p for p in net.parameters() if p.requires_grad], "weight_decay": weight_decay}]
    if decayed == "conv_and_linear_weights":
        # Every timm since 1.0.20 (the pin) excludes 1-D parameters here; `weight_decay_exclude_1d` (default
        # True) only exists since 1.0.27, so it is not passed. Kept (not the loop below) so that the parameter
        # order within the groups, which a resumed optimizer state relies on, stays that of older checkpoints.
        return param_groups_weight_decay(net, weight_decay=weight_decay)
    no_decay: list[nn.Parameter] = []
    decay: list[nn.Parameter] = []
    seen: set[int] = set()
    for module in net.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            skip = isinstance(module, _NORMS) or (
                decayed == "all_but_norm_and_depthwise" and name == "weight" and _is_depthwise(module)
            )
            (no_decay if skip else decay).append(param)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


_NORMS: tuple[type[nn.Module], ...] = tuple(
    t for t in (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, getattr(nn, "RMSNorm", None)) if t
)


def _is_depthwise(module: nn.Module) -> bool:
    # Keras' DepthwiseConv2D: one group per input channel. A grouped conv with fewer groups (ResNeXt) is a
    # Keras Conv2D(groups=...), which does read kernel_regularizer.
    return isinstance(module, nn.modules.conv._ConvNd) and module.groups > 1 and module.groups == module.in_channels


class SkipsOverflowedSteps:
    """Mixin for a torch optimizer: under fp16 loss scaling it skips an overflowed step on the device.

    torch.amp.GradScaler.step reads the found-inf flag with .item() before stepping an optimizer that cannot
    skip a step itself: a host sync every optimizer step (every run with torch's RMSprop under fp16). An
    optimizer that declares `_step_supports_amp_scaling` is handed the scale (`grad_scale`; None once
    unscaled, as imgcls's precision plugin does) and the flag (`found_inf`) as device tensors instead. Neither
    RMSprop's update nor timm's can be told to leave parameters and state alone (momentum and the square
    average move on a zero gradient too), and torch's fused kernels, which skip by the flag themselves, exist
    for SGD and Adam(W) only: so this step runs the optimizer's own step and then puts back, where the flag is
    set, the parameters and state it had before, all on the device. The `step` counters (unused by RMSprop's
    update) count a skipped step.

    What is put back is listed once (_OverflowUndo) and lives in flat buffers, so that a step costs a fixed
    handful of kernels per device and dtype rather than a Python walk over the parameters and their state (on
    a GPU the foreach copies are torch's multi-tensor kernels). It costs 3x the parameters' bytes of copies and
    selects a step over the update: TF's RMSprop (every EfficientNet AMP recipe) gates its own arithmetic instead
    (rmsprop_tf.RMSpropTF); torch's RMSprop, which no published recipe runs, keeps this."""

    _step_supports_amp_scaling = True
    _overflow_undo: _OverflowUndo | None = None

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        found_inf = getattr(self, "found_inf", None)
        if found_inf is None:  # no GradScaler (fp32, bf16), or stepped directly
            return super().step(closure)  # type: ignore[misc]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        optimizer = cast(torch.optim.Optimizer, self)
        undo = self._overflow_undo
        if undo is None or not undo.fits(optimizer):
            undo = self._overflow_undo = _OverflowUndo(optimizer)
        overflowed = found_inf.bool()
        scale = getattr(self, "grad_scale", None)
        if scale is not None:  # a GradScaler.step without unscale_ first: a walk, which imgcls's plugin spares
            grads = [p.grad for p in undo.params if p.grad is not None]
            torch._foreach_mul_(grads, scale.double().reciprocal().float())
        # State that this step makes has nothing to be put back to: its parameters get finite gradients instead.
        # Only until every parameter has state (the first step); later the list is empty.
        fresh = [p.grad for p in undo.stateless if p.grad is not None]
        for grad in fresh:
            grad.masked_fill_(overflowed.to(grad.device), 0.0)
        undo.save()
        super().step()  # type: ignore[misc]
        undo.restore(overflowed)
        if fresh:
            self._overflow_undo = None  # the next step lists the new state
        return loss


class _OverflowUndo:
    """An optimizer's parameters and state tensors as they were before a step, in flat buffers per device and
    dtype, and how to put them back. Its state tensors (but "step") move into one flat buffer per device and
    dtype, as views of their own shape and strides: saving them is one copy and putting them back one where,
    instead of a kernel per tensor. Parameters stay the network's own tensors (the network, its EMA and DDP hold
    them): a foreach copy out before the step, and after it one out, one where and one back.

    Valid while the optimizer's state dict and parameter groups are the objects it was made from
    (load_state_dict replaces both), no parameter gains state and the state tensors are still the views; the
    optimizer makes a new one when any of these fails. A state tensor replaced by hand by another tensor of
    the same key, in the middle of a buffer, is not noticed: nothing in imgcls or Lightning does that between
    optimizer steps (Lightning moves optimizer state to the device before the first)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.state, self.param_groups = optimizer.state, optimizer.param_groups
        self.shape = _group_shape(optimizer)
        self.n_state = len(optimizer.state)
        self.params = list({id(p): p for group in optimizer.param_groups for p in group["params"]}.values())
        self.stateless = [p for p in self.params if not optimizer.state.get(p)]
        params: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        entries: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, str]]] = defaultdict(list)
        for p in self.params:
            params[(p.device, p.dtype)].append(p)
            for key, value in optimizer.state.get(p, {}).items():
                if key != "step" and torch.is_tensor(value) and value.device == p.device:
                    entries[(value.device, value.dtype)].append((p, key))
        self.param_kinds = [_ParamCopies(tensors) for tensors in params.values()]
        self.state_kinds = [_FlatState(optimizer.state, kind) for kind in entries.values()]

    def fits(self, optimizer: torch.optim.Optimizer) -> bool:
        return (
            optimizer.state is self.state
            and optimizer.param_groups is self.param_groups
            and len(optimizer.state) == self.n_state
            and _group_shape(optimizer) == self.shape
            and all(kind.bound(optimizer.state) for kind in self.state_kinds)
        )

    def save(self) -> None:
        for params in self.param_kinds:
            torch._foreach_copy_(params.before_views, params.tensors)
        for state in self.state_kinds:
            state.before.copy_(state.live)

    def restore(self, overflowed: torch.Tensor) -> None:
        for params in self.param_kinds:
            torch._foreach_copy_(params.after_views, params.tensors)
            torch.where(overflowed.to(params.after.device), params.before, params.after, out=params.after)
            torch._foreach_copy_(params.tensors, params.after_views)
        for state in self.state_kinds:
            torch.where(overflowed.to(state.live.device), state.before, state.live, out=state.live)


def _group_shape(optimizer: torch.optim.Optimizer) -> tuple[int, ...]:
    return tuple(len(group["params"]) for group in optimizer.param_groups)


class _ParamCopies:
    """Parameters of one device and dtype, and two flat buffers with a view like each (before and after)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.before, self.before_views = flat_views(tensors)
        self.after, self.after_views = flat_views(tensors)


class _FlatState:
    """State tensors of one device and dtype moved into one flat buffer (`live`; the optimizer's state dicts hold
    views of it from now on) and a buffer for the copy from before a step."""

    def __init__(self, state: dict, entries: list[tuple[torch.Tensor, str]]) -> None:
        values = [state[p][key] for p, key in entries]
        self.live, views = flat_views(values)
        self.before = torch.zeros_like(self.live)
        self.entries = []
        for (p, key), value, view in zip(entries, values, views, strict=True):
            view.copy_(value)
            state[p][key] = view
            self.entries.append((p, key, view))

    def bound(self, state: dict) -> bool:
        """Whether the first and last state tensors are still the views (not, say, moved to another device)."""
        return all(state.get(p, {}).get(key) is view for p, key, view in (self.entries[0], self.entries[-1]))


OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


def skips_overflowed_steps(optimizer_class: type[OptimizerT]) -> type[OptimizerT]:
    """optimizer_class with SkipsOverflowedSteps (same name, arguments, state dict)."""
    # A subclass of optimizer_class, made by type(), whose result mypy knows only as `type`.
    return cast(type[OptimizerT], type(optimizer_class.__name__, (SkipsOverflowedSteps, optimizer_class), {}))


def build_optimizer(groups: list[dict], recipe: Any, lr: float, fused: bool = True) -> torch.optim.Optimizer:
    """fused=False when gradients are clipped: a fused optimizer (or one that skips overflowed steps itself)
    unscales inside its step, after clipping."""
    name = recipe.optimizer
    if name == "sgd":
        # fused: one kernel per step, and under fp16 loss scaling no host sync per step: GradScaler hands the
        # kernel its found-inf flag (the kernel skips the update itself) instead of reading it with .item()
        # to decide on the host (torch.amp.GradScaler.step, `_step_supports_amp_scaling`).
        sgd = torch.optim.SGD(
            groups, lr=lr, momentum=float(recipe.momentum), nesterov=bool(recipe.nesterov), fused=fused
        )
        if fused and float(recipe.momentum):
            # The fused kernel makes each momentum buffer with empty_like in its first step and, when that step
            # overflowed (GradScaler's found-inf flag), returns without writing it: the next step would read
            # uninitialized memory. Zero buffers from the start are the same arithmetic (dampening 0: momentum x 0
            # + grad is the first step's copy of grad, bitwise) and leave nothing unwritten.
            for group in sgd.param_groups:
                for param in group["params"]:
                    if param.requires_grad:
                        sgd.state[param]["momentum_buffer"] = torch.zeros_like(param)
        return sgd
    if name in ("rmsprop", "rmsprop_tf"):
        # rmsprop_tf: NVIDIA's TF2 EfficientNet (--optimizer rmsprop: rho --decay 0.9, --momentum 0.9, --opt_epsilon
        # 1e-3) runs TF's RMSProp kernel: epsilon inside the square root and the LR inside the momentum buffer.
        # torch's RMSprop adds eps outside the root, so with eps=1e-3 the two differ by orders of magnitude on small
        # gradients. timm's RMSpropTF is TF's update; it starts the square average at 1 (TF1's slot init; Keras'
        # RMSprop slot starts at 0, a difference that only matters in the first, warmup, steps).
        # fused: skips an overflowed step on the device. TF's update is imgcls's RMSpropTF (rmsprop_tf.py), which
        # gates its own arithmetic by the flag; torch's RMSprop gets the copy-and-select of SkipsOverflowedSteps.
        kind: type[torch.optim.RMSprop | TimmRMSpropTF]
        if name == "rmsprop":
            kind = skips_overflowed_steps(torch.optim.RMSprop) if fused else torch.optim.RMSprop
        else:
            kind = RMSpropTF if fused else TimmRMSpropTF
        return kind(
            groups,
            lr=lr,
            alpha=float(recipe.rmsprop_alpha),
            eps=float(recipe.rmsprop_eps),
            momentum=float(recipe.momentum),
        )
    raise ValueError(f"optimizer {name!r} is none of {OPTIMIZERS}")  # config.checks admits these only
