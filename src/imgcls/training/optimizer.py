"""The optimizer of the recipes (SGD, RMSprop, TF's RMSprop) and its parameter groups (which parameters are
decayed: recipe.weight_decay_on)."""

from __future__ import annotations

from typing import Any

import torch
from timm.optim import RMSpropTF as TimmRMSpropTF
from timm.optim import param_groups_weight_decay
from torch import nn

from imgcls.config.choices import OPTIMIZERS
from imgcls.training.rmsprop import RMSprop, RMSpropTF, initial_state


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
        # RMSprop slot starts at 0: recipe.rmsprop_initial_square_avg, 0 in tf2_efficientnet).
        # fused: skips an overflowed fp16 step on the device, gating its own update by GradScaler's flag
        # (rmsprop.py), where torch's and timm's step would have GradScaler read the flag on the host every step.
        kind: type[torch.optim.RMSprop | TimmRMSpropTF]
        if name == "rmsprop":
            kind = RMSprop if fused else torch.optim.RMSprop
        else:
            kind = RMSpropTF if fused else TimmRMSpropTF
        rmsprop = kind(
            groups,
            lr=lr,
            alpha=float(recipe.rmsprop_alpha),
            eps=float(recipe.rmsprop_eps),
            momentum=float(recipe.momentum),
        )
        start = getattr(recipe, "rmsprop_initial_square_avg", None)
        if start is not None:  # the state the first step would make, but for where the square average starts
            for group in rmsprop.param_groups:
                for param in group["params"]:
                    if param.requires_grad:
                        rmsprop.state[param].update(initial_state(param, group, float(start)))
        return rmsprop
    raise ValueError(f"optimizer {name!r} is none of {OPTIMIZERS}")  # config.checks admits these only
