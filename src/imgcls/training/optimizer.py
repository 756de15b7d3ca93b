"""The optimizer of the recipes (SGD, RMSprop, TF's RMSprop) and its parameter groups (which parameters are
decayed: recipe.weight_decay_on)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, TypeVar, cast

import torch
from timm.optim import RMSpropTF, param_groups_weight_decay
from torch import nn

from imgcls.config.choices import OPTIMIZERS


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
    skip a step itself: a host sync every optimizer step (every EfficientNet AMP run, with RMSprop). An
    optimizer that declares `_step_supports_amp_scaling` is handed the scale (`grad_scale`; None once
    unscaled) and the flag (`found_inf`) as device tensors instead. This step unscales the gradients, runs the
    optimizer's own step, and then puts back, where the flag is set, the parameters and state it had before;
    all on the device, in a handful of kernels (a flat copy and one where per dtype). Hand-written: torch's
    fused kernels do this for SGD and Adam(W) only, timm's optimizers not at all. Host-side counters (a CPU
    `step` tensor, unused by RMSprop's update) still count a skipped step."""

    _step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        found_inf = getattr(self, "found_inf", None)
        if found_inf is None:  # no GradScaler (fp32, bf16), or stepped directly
            return super().step(closure)  # type: ignore[misc]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]  # type: ignore[attr-defined]
        grads = [p.grad for p in params]
        scale = getattr(self, "grad_scale", None)
        if scale is not None:
            torch._foreach_mul_(grads, scale.double().reciprocal().float())
        overflowed = found_inf.bool()
        if any(not self.state[p] for p in params):  # type: ignore[attr-defined]
            # State made in this step has nothing to be put back to: give it finite gradients (once, rarely).
            for grad in grads:
                grad.copy_(torch.where(overflowed, torch.zeros_like(grad), grad))
        kept = list(params) + [
            t
            for p in params
            for t in self.state[p].values()  # type: ignore[attr-defined]
            if torch.is_tensor(t) and t.device == p.device
        ]
        before = _flat_copies(kept)
        super().step()  # type: ignore[misc]
        for (device, _dtype), (tensors, flat) in before.items():
            after = torch.cat([t.reshape(-1) for t in tensors])
            chosen = torch.where(overflowed.to(device), flat, after)
            torch._foreach_copy_(
                tensors, [v.view_as(t) for v, t in zip(chosen.split([t.numel() for t in tensors]), tensors)]
            )
        return loss


def _flat_copies(tensors: list[torch.Tensor]) -> dict[tuple[Any, Any], tuple[list[torch.Tensor], torch.Tensor]]:
    groups: dict[tuple[Any, Any], list[torch.Tensor]] = defaultdict(list)
    for t in tensors:
        groups[(t.device, t.dtype)].append(t)
    return {key: (group, torch.cat([t.reshape(-1) for t in group])) for key, group in groups.items()}


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
        kind: type[torch.optim.RMSprop | RMSpropTF] = torch.optim.RMSprop if name == "rmsprop" else RMSpropTF
        rmsprop = skips_overflowed_steps(kind) if fused else kind
        return rmsprop(
            groups,
            lr=lr,
            alpha=float(recipe.rmsprop_alpha),
            eps=float(recipe.rmsprop_eps),
            momentum=float(recipe.momentum),
        )
    raise ValueError(f"optimizer {name!r} is none of {OPTIMIZERS}")  # config.checks admits these only
