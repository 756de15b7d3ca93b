"""Callbacks that let a run survive kills, preemption, numerical faults and bad files.

- RNGState: the global RNG states (torch, CUDA, numpy, python) of every rank travel in the checkpoint, so
  a resumed run draws the same augmentations and mixup lambdas as an uninterrupted one. Hand-written:
  Lightning 2.6 restores model, optimizer, schedulers, loops and stateful loaders, but not RNG states.
- Preemption: SIGTERM (and SIGUSR1 outside SLURM) saves last.ckpt at the next optimizer-step boundary
  and exits with 128 + the signal number. Lightning's own SIGTERM handling stops only at the end of the
  epoch on a single process, and raises mid-validation without a checkpoint; under SLURM its SIGUSR1
  handler (SLURMEnvironment auto_requeue) still saves the hpc checkpoint and requeues.
- FiniteLoss: a NaN/Inf loss stops the run before backward (so no optimizer step and no checkpoint holds
  it), naming the step and the LR. With fp16 AMP the loss scaler's skipped steps are counted instead.
- BadImageReport: the files skipped under data.on_bad_image=skip, over all ranks, into report.json.
"""

from __future__ import annotations

import logging
import math
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.pytorch.utilities.exceptions import SIGTERMException

from imgcls.callbacks.report import ReportCallback
from imgcls.errors import TrainingError

log = logging.getLogger(__name__)


def _gather(obj: Any) -> list[Any]:
    """Every rank's `obj` (a collective under DDP; [obj] in a single process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class RNGState(L.Callback):
    def __init__(self) -> None:
        self._loaded: list[dict[str, Any]] | None = None

    def state_dict(self) -> dict[str, Any]:
        # Called on every rank while a checkpoint is assembled; rank 0 writes the gathered list.
        states = _collect_rng_states(include_cuda=torch.cuda.is_available())
        # Lightning loads checkpoints with torch.load(weights_only=True), which refuses numpy arrays.
        name, keys, pos, has_gauss, gauss = states["numpy"]
        states["numpy"] = (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
        return {"ranks": _gather(states)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = list(state_dict.get("ranks") or [])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Applied here, after everything the restore does, right before the first resumed batch.
        if self._loaded:
            if len(self._loaded) != trainer.world_size:
                log.warning(
                    "resuming %d ranks from %d: RNG streams differ from an uninterrupted run",
                    trainer.world_size,
                    len(self._loaded),
                )
            states = dict(self._loaded[trainer.global_rank % len(self._loaded)])
            name, keys, pos, has_gauss, gauss = states["numpy"]
            states["numpy"] = (name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss)
            _set_rng_states(states)
            self._loaded = None


class Preempted(SIGTERMException):
    """Raised after last.ckpt was saved on a signal; the process exits with 128 + signum (143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)


class Preemption(L.Callback):
    def __init__(self, last_path: str | Path, slurm_requeue: bool = False) -> None:
        self.last_path = Path(last_path)
        # Under SLURM auto-requeue, SIGUSR1 stays Lightning's (hpc checkpoint + scontrol requeue).
        self.signals = [signal.SIGTERM] if slurm_requeue else [signal.SIGTERM, signal.SIGUSR1]
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._step = -1

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum  # only a flag: the save happens in the training loop, at a consistent point

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After Lightning registered its handlers (Trainer._run), so ours replace its SIGTERM notifier.
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handler)
        self._step = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._step:
            return  # inside a gradient-accumulation window: its partial gradients are not in a checkpoint
        self._step = trainer.global_step
        # Any rank's signal stops all ranks at the same step (one tiny all-reduce per optimizer step).
        pending = self.received is not None or trainer.received_sigterm  # (before on_train_start: Lightning's flag)
        if trainer.strategy.reduce_boolean_decision(pending, all=False):
            signum = self.received or signal.SIGTERM
            log.warning(
                "received signal %d: saving %s at step %d and exiting", signum, self.last_path, trainer.global_step
            )
            trainer.save_checkpoint(self.last_path)
            raise Preempted(signum)

    # Restored here, not in teardown(): Lightning restores its own signal handlers before teardown hooks run.
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}


class FiniteLoss(L.Callback):
    def __init__(self, last_path: str | Path) -> None:
        self.last_path = Path(last_path)
        self.skipped_steps = 0
        self._scale: float | None = None

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if bool(torch.isfinite(loss.detach()).all()):
            return
        lr = trainer.optimizers[0].param_groups[-1]["lr"] if trainer.optimizers else math.nan
        kept = f"the last good checkpoint is {self.last_path}" if self.last_path.exists() else "no checkpoint yet"
        raise TrainingError(
            f"train.loss is {float(loss.detach().float().mean())} at step {trainer.global_step} "
            f"(epoch {trainer.current_epoch}, batch {trainer.fit_loop.epoch_loop.batch_idx}) with lr {lr:.6g}; "
            f"stopped before the optimizer step, {kept} (resume with ckpt_path=last, e.g. with a lower "
            "recipe.lr_per_256)"
        )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # fp16 AMP: the scaler skips a step (and halves its scale) on inf/NaN gradients. That is normal
        # early in training, so it is counted and logged, not fatal.
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is None or not scaler.is_enabled():
            return
        scale = float(scaler.get_scale())
        if self._scale is not None and scale < self._scale:
            self.skipped_steps += 1
            log.info("AMP loss scaler skipped step %d (scale %g -> %g)", trainer.global_step, self._scale, scale)
        self._scale = scale
        pl_module.log("train.amp_skipped_steps", float(self.skipped_steps), on_step=True, on_epoch=False)

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))


class BadImageReport(L.Callback):
    """Put before ReportCallback in the callback list, so the count is in the row it writes."""

    def __init__(self, report: ReportCallback) -> None:
        self.report = report
        self.files: dict[str, str] = {}
        # Samples mixup dropped to even a batch a bad file left odd, and batches of one it could not mix
        # (module._mix), summed over ranks. Earlier processes of a resumed run count from the checkpoint,
        # as of its last epoch end or validation.
        self.mixup: dict[str, int] = {}
        self._mixup_before: dict[str, int] = {}

    def _log(self, trainer: L.Trainer) -> Any:
        backend = getattr(trainer.datamodule, "backend", None)
        return getattr(backend, "bad_images", None)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        bad = self._log(trainer)
        if bad is not None:  # a resumed run does not warn again about files it already reported
            bad.files.update(self.files)

    def _collect(self, trainer: L.Trainer) -> None:
        bad = self._log(trainer)
        mine = dict(bad.files) if bad is not None else {}
        module = trainer.lightning_module
        counts = {k: int(getattr(module, k, 0)) for k in ("mixup_dropped_samples", "mixup_unmixed_batches")}
        totals = dict(self._mixup_before)
        for files, rank_counts in _gather((mine, counts)):
            self.files.update(files)
            for key, value in rank_counts.items():
                totals[key] = totals.get(key, 0) + value
        self.mixup = {k: v for k, v in totals.items() if v}
        if self.files or self.mixup or "bad_images" in self.report.extra:
            self.report.extra["bad_images"] = {
                "count": len(self.files), "files": dict(sorted(self.files.items())), **self.mixup
            }

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._collect(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._collect(trainer)

    def state_dict(self) -> dict[str, Any]:
        return {"files": self.files, "mixup": self.mixup}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.files = dict(state_dict.get("files", {}))
        self.mixup = self._mixup_before = dict(state_dict.get("mixup", {}))
