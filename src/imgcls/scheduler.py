"""The LR schedule of the recipes, in one place: peak LR by the linear scaling rule, linear warmup, cosine
decay to `recipe.end_lr`, stepped every optimizer step over the recipe's whole length."""

from __future__ import annotations

import math
from typing import Any

import torch
from timm.scheduler import CosineLRScheduler


def scaled_lr(lr_per_256: float, global_batch: int) -> float:
    """The linear scaling rule NVIDIA uses: 0.256 per 256 images for the ResNets."""
    return lr_per_256 * global_batch / 256


def warmup_steps(total_steps: int, epochs: int, warmup_epochs: float) -> int:
    """Warmup length in optimizer steps; the schedule is stepped per optimizer step, not per epoch."""
    return min(total_steps, round(warmup_epochs * total_steps / max(1, epochs)))


def total_steps(trainer: Any, epochs: int) -> int:
    """Optimizer steps of the whole recipe. They span the recipe's epochs even when this invocation stops
    earlier (trainer.max_epochs < recipe.epochs: a run split into stages, resumed with ckpt_path)."""
    # estimated_stepping_batches loads the train loader (so num_training_batches is known); it is not
    # used itself because it shrinks with trainer.max_steps / max_epochs.
    estimated = trainer.estimated_stepping_batches
    batches = trainer.num_training_batches
    if math.isinf(batches):  # a loader without a length (benchmark mode): Lightning's estimate
        return max(1, int(min(estimated, 2**31)))
    return max(1, math.ceil(batches / trainer.accumulate_grad_batches) * epochs)


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


def recipe_scheduler(optimizer: torch.optim.Optimizer, trainer: Any, recipe: Any) -> CosineLRScheduler:
    """The schedule of `recipe` (epochs, warmup_epochs, end_lr) for this trainer's loader."""
    epochs = int(recipe.epochs)
    total = total_steps(trainer, epochs)
    warmup = warmup_steps(total, epochs, float(recipe.warmup_epochs))
    return build_scheduler(optimizer, total, warmup, float(recipe.end_lr))
