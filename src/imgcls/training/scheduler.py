"""The LR schedule of the recipes, in one place: peak LR (linear scaling rule), linear warmup, then
`recipe.schedule` (cosine, linear or step, as NVIDIA's --lr-schedule; TF1's cosine; TF2's exponential), over the
recipe's whole length; the LR changes every optimizer step, or at epoch starts (`recipe.lr_interval=epoch`, NVIDIA's
PyTorch lr_policy)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from timm.scheduler import CosineLRScheduler, MultiStepLRScheduler, PolyLRScheduler, StepLRScheduler
from timm.scheduler.scheduler import Scheduler

from imgcls.config.choices import SCHEDULES

if TYPE_CHECKING:
    from imgcls.config.schema import RecipeSchema


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
    return recipe_steps(int(batches), int(trainer.accumulate_grad_batches), epochs)


def recipe_steps(batches_per_epoch: int, accumulation: int, epochs: int) -> int:
    """Optimizer steps of `epochs` epochs of `batches_per_epoch` micro-batches (an epoch's last partial
    accumulation still steps, as Lightning does)."""
    return max(1, math.ceil(batches_per_epoch / accumulation) * epochs)


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_steps: int,
    end_lr: float,
    schedule: str,
    milestones: tuple[float, ...] = (),
    epochs: int | None = None,
    decay_rate: float | None = None,
    decay_epochs: float | None = None,
) -> Scheduler:
    """Linear warmup from 0 over `warmup_steps`, then NVIDIA's `--lr-schedule` decay:

    - cosine: to `end_lr` at `total_steps`;
    - linear: base * (1 - e/es) after warmup, i.e. a straight line to `end_lr` (0) at `total_steps`;
    - step: x0.1 at the epochs in `milestones` (absolute epochs, as NVIDIA counts them; needs `epochs`);
    - cosine_tf1: NVIDIA's TF1 `--cosine_lr`, `tf.train.cosine_decay(lr, global_step, total steps)`: the cosine
      runs over all steps from step 0, so the warmup ends below the peak (0.981 x lr after 8 of 90 epochs).
    - exponential: NVIDIA's TF2 `--lr_decay exponential` (its default): x `decay_rate` every `decay_epochs`
      epochs after the warmup, in stairs (TF2/utils/optimizer_factory.py:329-334 ExponentialDecay(staircase=True,
      runtime/runner_utils.py:89) on the step count less the warmup, utils/learning_rate.py:50-63).

    Stepped every optimizer step with the optimizer-step count, with timm's schedulers rather than hand-written
    formulas; EpochStartLR holds it at epoch starts, as NVIDIA's PyTorch code changes it.
    """
    common: dict[str, Any] = {"warmup_t": warmup_steps, "warmup_lr_init": 0.0, "t_in_epochs": False}
    decay_steps = max(1, total_steps - warmup_steps)
    if schedule == "cosine":
        return CosineLRScheduler(optimizer, t_initial=decay_steps, lr_min=end_lr, warmup_prefix=True, **common)
    if schedule == "cosine_tf1":  # timm without warmup_prefix: the cosine's t is the global step, warmup included
        return CosineLRScheduler(optimizer, t_initial=max(1, total_steps), lr_min=end_lr, warmup_prefix=False, **common)
    if schedule == "linear":
        return PolyLRScheduler(optimizer, t_initial=decay_steps, power=1.0, lr_min=end_lr, warmup_prefix=True, **common)
    if schedule == "step":
        if not milestones:  # recipe.lr_milestones (recipe/90e.yaml) is the one home of NVIDIA's epochs
            raise ValueError("schedule 'step' needs milestones")
        steps_per_epoch = total_steps / max(1, epochs or 1)
        # +1: timm's MultiStep decays once t + 1 reaches a milestone (its epoch-end convention); here t counts
        # optimizer steps done, and the first step of epoch m must already run at the decayed LR.
        decay_t = [round(m * steps_per_epoch) + 1 for m in milestones]
        return MultiStepLRScheduler(optimizer, decay_t=decay_t, decay_rate=0.1, warmup_prefix=False, **common)
    if schedule == "exponential":
        if decay_rate is None or decay_epochs is None:  # config.checks requires both with this schedule
            raise ValueError("schedule 'exponential' needs decay_rate and decay_epochs")
        steps_per_epoch = total_steps / max(1, epochs or 1)
        return StepLRScheduler(
            optimizer, decay_t=decay_epochs * steps_per_epoch, decay_rate=decay_rate, warmup_prefix=True, **common
        )
    raise ValueError(f"schedule {schedule!r} is none of {SCHEDULES}")  # config.checks admits these only


class EpochStartLR:
    """A schedule whose LR changes only at epoch starts: NVIDIA's PyTorch `lr_policy` sets the LR from the epoch
    number alone, ignoring the iteration (image_classification/optimizers.py:82-130, called each iteration with
    the epoch, training.py:368). Epoch e runs at the per-step schedule's value at e's first step, except in the
    warmup, where NVIDIA's warmup is base x (e + 1) / W (optimizers.py:95-96,108-109,121-122), the per-step
    warmup's value at e's last step + 1. So cosine is end + (base - end)(1 + cos(pi e / es)) / 2, linear
    base (1 - e / es), step x0.1 at the milestones, with e = epoch - W, es = epochs - W, as NVIDIA's. A 10-epoch
    cosine without warmup averages 0.55 x base, not 0.5 (a per-step cosine): 10 % more. Stepped like the timm
    scheduler it wraps (step_update with the optimizer-step count)."""

    def __init__(self, schedule: Scheduler, steps_per_epoch: int, warmup_epochs: float) -> None:
        self.schedule = schedule
        self.optimizer = schedule.optimizer  # Lightning checks which optimizer a scheduler drives
        self.steps_per_epoch = max(1, int(steps_per_epoch))
        self.warmup_epochs = float(warmup_epochs)
        self.step_update(0)  # the first epoch's LR from the first step (timm's warmup would start at 0)

    def schedule_step(self, num_updates: int) -> int:
        """The per-step schedule's step whose LR the epoch of step `num_updates` runs at."""
        epoch = int(num_updates) // self.steps_per_epoch
        return (epoch + 1 if epoch < self.warmup_epochs else epoch) * self.steps_per_epoch

    def step_update(self, num_updates: int, metric: Any = None) -> None:
        self.schedule.step_update(self.schedule_step(num_updates), metric)

    def step(self, epoch: int, metric: Any = None) -> None:
        self.schedule.step(epoch, metric)

    def state_dict(self) -> dict[str, Any]:
        return self.schedule.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.schedule.load_state_dict(state_dict)


def recipe_scheduler(optimizer: torch.optim.Optimizer, trainer: Any, recipe: RecipeSchema) -> Scheduler | EpochStartLR:
    """The schedule of `recipe` (schedule, epochs, warmup_epochs, end_lr, lr_interval) for this trainer's loader."""
    epochs = int(recipe.epochs)
    total = total_steps(trainer, epochs)
    warmup = warmup_steps(total, epochs, float(recipe.warmup_epochs))
    milestones = tuple(recipe.lr_milestones)
    rate, every = recipe.lr_decay_rate, recipe.lr_decay_epochs
    schedule = build_scheduler(
        optimizer, total, warmup, float(recipe.end_lr), str(recipe.schedule), milestones, epochs,
        decay_rate=None if rate is None else float(rate), decay_epochs=None if every is None else float(every),
    )  # fmt: skip
    interval = str(recipe.lr_interval)
    if interval == "epoch":
        return EpochStartLR(schedule, total // max(1, epochs), float(recipe.warmup_epochs))
    return schedule
