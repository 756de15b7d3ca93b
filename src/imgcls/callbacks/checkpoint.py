"""The checkpoint callbacks: when last.ckpt, best.ckpt and epoch_NNNN.ckpt are saved (their paths and writer:
training/checkpoint.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import ModelCheckpoint

from imgcls.training.checkpoint import EPOCH_FILENAME, best_path, last_path

if TYPE_CHECKING:
    from imgcls.config.schema import CallbacksCheckpointSchema


def _checkpoint(dirpath: Path, filename: str, kind: type[ModelCheckpoint] = ModelCheckpoint, **kwargs: Any) -> Any:
    kwargs.setdefault("save_top_k", 1)
    return kind(
        dirpath=dirpath,
        filename=filename,
        enable_version_counter=False,  # overwrite last.ckpt / best.ckpt in place (atomically)
        auto_insert_metric_name=False,
        # After the whole epoch, validation included: a checkpoint taken at validation end makes
        # Lightning re-run that validation on resume.
        save_on_train_epoch_end=True,
        **kwargs,
    )


class LastCheckpoint(ModelCheckpoint):
    """last.ckpt after every epoch; for a run that stops inside an epoch (trainer.max_steps, or
    trainer.max_time via Lightning's Timer), after its final optimizer step instead.

    Lightning ends a cut-short epoch with the epoch-end hooks, so a checkpoint saved there records the
    epoch as complete and a resumed run would skip the rest of it (seen: stop at max_steps=4 of 6, resume,
    and the run ended at once with "max_epochs=2 reached"). Saved after the final step, the loop state is
    mid-epoch and the resumed run continues with the next batch."""

    _seen_step = -1

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        stepped, self._seen_step = trainer.global_step != self._seen_step, trainer.global_step
        stopping = trainer.should_stop or 0 < trainer.max_steps <= trainer.global_step
        if stepped and stopping and not _is_last_batch(trainer):
            trainer.save_checkpoint(self.format_checkpoint_name({}))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if _is_last_batch(trainer):  # a cut-short epoch was saved at its final step
            super().on_train_epoch_end(trainer, pl_module)


def _is_last_batch(trainer: Any) -> bool:
    return bool(getattr(trainer.fit_loop.epoch_loop.batch_progress, "is_last_batch", True))


class StepCheckpoint(ModelCheckpoint):
    """last.ckpt every K optimizer steps, except at an epoch's last batch: a checkpoint taken there,
    before validation, resumes with that epoch's validation (and its report row) skipped. The epoch-end
    checkpoint follows right after validation instead."""

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if _is_last_batch(trainer):
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def checkpoint_callbacks(
    cfg: CallbacksCheckpointSchema | None, run_dir: str | Path, has_val: bool = True
) -> list[ModelCheckpoint]:
    """`last.ckpt` every epoch (and every K steps if asked), `best.ckpt` on the monitored metric.

    "last" is its own monitor-less callback: Lightning 2.6's `save_last=True` only refreshes last.ckpt
    when the monitored top-k checkpoint was saved, i.e. not after an epoch without improvement."""
    if cfg is None:
        return []
    last, best = last_path(run_dir), best_path(run_dir)
    # every_n_epochs null: Lightning's own trigger, every epoch.
    callbacks = [_checkpoint(last.parent, last.stem, LastCheckpoint, every_n_epochs=cfg.every_n_epochs)]
    if has_val and cfg.monitor:
        mode = "min" if "loss" in cfg.monitor else "max"  # config.choices VALIDATION_METRICS: accuracies, losses
        callbacks.append(_checkpoint(best.parent, best.stem, monitor=cfg.monitor, mode=mode))
    if cfg.every_n_train_steps:
        steps = cfg.every_n_train_steps
        callbacks.append(_checkpoint(last.parent, last.stem, StepCheckpoint, every_n_train_steps=steps))
    if cfg.keep_epochs:  # NVIDIA --gather-checkpoints: a file per epoch, the newest N (-1: all)
        keep = cfg.keep_epochs
        callbacks.append(_checkpoint(last.parent, EPOCH_FILENAME, monitor="epoch", mode="max", save_top_k=keep))
    return callbacks
