"""The optimizer of the recipes (SGD, RMSprop, TF's RMSprop) and its parameter groups (no weight decay on norms
and biases)."""

from __future__ import annotations

from typing import Any

import torch
from timm.optim import RMSpropTF, param_groups_weight_decay
from torch import nn

from imgcls.choices import OPTIMIZERS
from imgcls.errors import ConfigError


def parameter_groups(net: nn.Module, weight_decay: float, norm_bias_weight_decay: bool = False) -> list[dict]:
    """Two groups: decayed weights, and every 1-D parameter (all norm-layer weights/biases and all
    biases) without weight decay. Chosen by parameter kind, not by a substring of its name: NVIDIA's
    `"bn" in name` test missed the ResNet downsample BN (`downsample.1`)."""
    if norm_bias_weight_decay:
        return [{"params": [p for p in net.parameters() if p.requires_grad], "weight_decay": weight_decay}]
    # Every timm since 1.0.20 (the pin) excludes 1-D parameters here; `weight_decay_exclude_1d` (default True)
    # only exists since 1.0.27, so it is not passed.
    return param_groups_weight_decay(net, weight_decay=weight_decay)


def build_optimizer(groups: list[dict], recipe: Any, lr: float, fused: bool = True) -> torch.optim.Optimizer:
    """fused=False when gradients are clipped: a fused optimizer unscales inside its step, after clipping."""
    name = recipe.optimizer
    if name == "sgd":
        # fused: one kernel per step, and under fp16 loss scaling no host sync per step: GradScaler hands the
        # kernel its found-inf flag (the kernel skips the update itself) instead of reading it with .item()
        # to decide on the host (torch.amp.GradScaler.step, `_step_supports_amp_scaling`).
        return torch.optim.SGD(
            groups, lr=lr, momentum=float(recipe.momentum), nesterov=bool(recipe.nesterov), fused=fused
        )
    if name == "rmsprop":
        return torch.optim.RMSprop(
            groups,
            lr=lr,
            alpha=float(recipe.rmsprop_alpha),
            eps=float(recipe.rmsprop_eps),
            momentum=float(recipe.momentum),
        )
    if name == "rmsprop_tf":
        # NVIDIA's TF2 EfficientNet (--optimizer rmsprop: rho --decay 0.9, --momentum 0.9, --opt_epsilon 1e-3) runs
        # TF's RMSProp kernel: epsilon inside the square root and the LR inside the momentum buffer. torch's
        # RMSprop adds eps outside the root, so with eps=1e-3 the two differ by orders of magnitude on small
        # gradients. timm's RMSpropTF is TF's update; it starts the square average at 1 (TF1's slot init;
        # Keras' RMSprop slot starts at 0, a difference that only matters in the first, warmup, steps).
        return RMSpropTF(
            groups,
            lr=lr,
            alpha=float(recipe.rmsprop_alpha),
            eps=float(recipe.rmsprop_eps),
            momentum=float(recipe.momentum),
        )
    raise ConfigError(f"recipe.optimizer={name} is not supported; allowed: {', '.join(OPTIMIZERS)}")
