"""The callbacks of a training run, in the order they must run, and why that order.

Lightning calls callbacks in list order for every hook, so a callback that feeds another comes first:
the bad-image and loss checks fill in what the report writes; the rank seed is set before a resumed run's
RNG state is restored over it. `mode=benchmark` runs these same callbacks, so its numbers are those of the
real loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping
from omegaconf import DictConfig

from imgcls.callbacks.bad_image_report import BadImageReport
from imgcls.callbacks.checkpoint import checkpoint_callbacks
from imgcls.callbacks.console import MeasuredModelSummary, progress_bar
from imgcls.callbacks.epoch_log import EpochLog, ProgressLines, run_command
from imgcls.callbacks.finite_loss import FiniteLoss
from imgcls.callbacks.garbage_collection import FreezeSetupObjects
from imgcls.callbacks.host_syncs import HostSyncCount
from imgcls.callbacks.preemption import Preemption, requeue_by
from imgcls.callbacks.report import ReportCallback
from imgcls.callbacks.seeding import RankSeed, RNGState
from imgcls.callbacks.wandb_media import wandb_media_callbacks
from imgcls.data.datamodule import ClassificationDataModule
from imgcls.redaction import redact_url
from imgcls.training.checkpoint import last_path

if TYPE_CHECKING:
    from imgcls.config.schema import CallbacksSchema, DataSchema, PrecisionSchema, RecipeSchema, TrainerSchema


def data_args(data: DataSchema) -> list[str]:
    """The data overrides that evaluate.py needs to read this run's val split (a checkpoint names no data: a file
    from elsewhere must not choose what is read, run or fetched)."""
    args = [f"data.root={redact_url(str(data.root))}"]
    if data.format != "folder":
        args.append(f"data.format={data.format}")
    return args


def training_callbacks(
    cfg: DictConfig, run_dir: Path, datamodule: ClassificationDataModule
) -> tuple[list[L.Callback], ReportCallback]:
    """Every callback of a training run, in order, and the report (the run's summary comes from it)."""
    trainer: TrainerSchema = cfg.trainer
    precision: PrecisionSchema = cfg.precision
    recipe: RecipeSchema = cfg.recipe
    settings: CallbacksSchema = cfg.callbacks
    report = ReportCallback(run_dir, command=run_command(Path(run_dir)))
    last = last_path(run_dir)
    validates = trainer.limit_val_batches != 0  # 0: NVIDIA --training-only
    # precision/amp.yaml's; the precisions without a loss scaler (fp32, tf32, bf16) skip no step and set none.
    overflows = precision.max_consecutive_overflows
    every_n_steps = settings.log_every_n_steps  # null: no progress lines
    lines = ProgressLines(recipe.epochs, every_n_steps) if every_n_steps else None
    callbacks: list[L.Callback] = [
        BadImageReport(report, datamodule.bad_images),  # before the report: its rows carry the skipped files
        FiniteLoss(last, report, max_consecutive_overflows=overflows),  # before the report: skipped AMP steps
        report,
        EpochLog(report, run_dir, recipe.epochs, plots=settings.charts, data_args=data_args(cfg.data)),
        # (after the report: logs the row it has just made)
        *([lines] if lines is not None else []),  # a log line every N optimizer steps (NVIDIA's print_freq)
        RankSeed(int(cfg.seed)),  # seed + global rank in setup; then RNGState restores a resumed run's state
        RNGState(),
        FreezeSetupObjects(),  # the collector skips what setup made (no 0.4 s full pass on a step)
        Preemption(last, requeue=requeue_by(), run_dir=run_dir),  # saves last.ckpt at a step boundary
        *checkpoint_callbacks(settings.checkpoint, run_dir, validates),  # after the report: rows in ckpt
        *wandb_media_callbacks(cfg.logger, cfg.data, datamodule.classes),  # sample images, per-class accuracy (W&B)
    ]
    patience = settings.early_stopping_patience
    if patience:  # NVIDIA --early-stopping-patience: epochs without a better val top-1 (validation: checks.py)
        callbacks.append(EarlyStopping(monitor="val.top1", mode="max", patience=patience))
    # The console: a bar that draws on a terminal only, numbering epochs as the epoch lines do; the summary without
    # an unmeasured FLOPs count (callbacks/console.py).
    redraw_every = settings.progress_bar_every_n_steps or 1  # null: every batch, as Lightning's bar draws
    loss_of = lines.loss if lines is not None else None  # the bar shows the progress lines' loss
    bar = progress_bar(settings.progress_bar, recipe.epochs, redraw_every, loss_of)
    if bar is not None:
        callbacks.append(bar)
    if trainer.enable_model_summary and not trainer.barebones:  # barebones refuses one
        callbacks.append(MeasuredModelSummary())
    if settings.count_host_syncs:  # last: its batch-end hook follows every other callback's
        callbacks.append(HostSyncCount(report))
    return callbacks, report
