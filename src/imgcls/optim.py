"""Optimizer, parameter groups and the per-step LR schedule of the recipes."""

from __future__ import annotations

from typing import Any

import torch
from timm.optim import param_groups_weight_decay
from timm.scheduler import CosineLRScheduler
from torch import nn

from imgcls.errors import ConfigError

OPTIMIZERS = ("sgd", "rmsprop")


def parameter_groups(net: nn.Module, weight_decay: float, norm_bias_weight_decay: bool = False) -> list[dict]:
    """Two groups: decayed weights, and every 1-D parameter (all norm-layer weights/biases and all
    biases) without weight decay. Chosen by parameter kind, not by a substring of its name: NVIDIA's
    `"bn" in name` test missed the ResNet downsample BN (`downsample.1`)."""
    if norm_bias_weight_decay:
        return [{"params": [p for p in net.parameters() if p.requires_grad], "weight_decay": weight_decay}]
    # Every timm since 1.0.20 (the pin) excludes 1-D parameters here; `weight_decay_exclude_1d` (default True)
    # only exists since 1.0.27, so it is not passed.
    return param_groups_weight_decay(net, weight_decay=weight_decay)


def build_optimizer(groups: list[dict], recipe: Any, lr: float) -> torch.optim.Optimizer:
    name = recipe.optimizer
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=float(recipe.momentum), nesterov=bool(recipe.nesterov))
    if name == "rmsprop":
        return torch.optim.RMSprop(
            groups,
            lr=lr,
            alpha=float(recipe.rmsprop_alpha),
            eps=float(recipe.rmsprop_eps),
            momentum=float(recipe.momentum),
        )
    raise ConfigError(f"recipe.optimizer={name} is not supported; allowed: {', '.join(OPTIMIZERS)}")


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, end_lr: float
) -> CosineLRScheduler:
    """Linear warmup from 0 over `warmup_steps`, then cosine to `end_lr` at `total_steps`.

    Stepped every optimizer step with the optimizer-step count (NVIDIA changed the LR once per epoch).
    """
    return CosineLRScheduler(
        optimizer,
        t_initial=max(1, total_steps - warmup_steps),
        lr_min=end_lr,
        warmup_t=warmup_steps,
        warmup_lr_init=0.0,
        warmup_prefix=True,
        t_in_epochs=False,
    )
