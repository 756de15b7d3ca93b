"""Callbacks that let a run survive kills, preemption, numerical faults and bad files.

- RNGState: the global RNG states (torch, CUDA, numpy, python) of every rank travel in the checkpoint, so
  a resumed run draws the same augmentations and mixup lambdas as an uninterrupted one. Hand-written:
  Lightning 2.6 restores model, optimizer, schedulers, loops and stateful loaders, but not RNG states.
- Preemption: SIGTERM and SIGUSR1 save last.ckpt at an optimizer-step boundary, the same step on every
  rank, and exit with 128 + the signal number; under SLURM, SIGUSR1 also requeues the job. Lightning's own
  SIGTERM handling stops only at the end of the epoch on a single process, and raises mid-validation
  without a checkpoint; its SLURM SIGUSR1 handler saves inside the signal handler (collectives at an
  arbitrary point of another rank's step can hang).
- FiniteLoss: a NaN/Inf loss stops the run without a host sync per step, never letting it into a saved
  checkpoint, naming the step and the LR. With fp16 AMP the loss scaler's skipped steps are counted, and
  only a run of them stops the run.

Host syncs (a GPU's launch queue drains while the CPU waits) are kept out of the per-step path: the
checks that need one run every SYNC_EVERY_N_STEPS optimizer steps, at the same steps on every rank.
- BadImageReport: the files skipped under data.on_bad_image=skip, over all ranks, into report.json.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import subprocess
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

# Optimizer steps between the host syncs of FiniteLoss and of Preemption under DDP. Lightning's logging
# syncs every trainer.log_every_n_steps (50 by default), a multiple of this, so the syncs coincide.
SYNC_EVERY_N_STEPS = 10


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
    """Raised after the checkpoint was saved on a signal; the process exits with 128 + signum (143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)


def slurm_job_id() -> str:
    """The id `scontrol requeue` takes (an array task's is JOBID_TASKID), as Lightning's SLURM handler builds it."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job is not None:
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ["SLURM_JOB_ID"]


class Preemption(L.Callback):
    """Signals set a flag; the save happens at an optimizer-step boundary, on every rank at the same step.

    Single process: the flag is read at every optimizer step (a Python bool, no sync). Under DDP one
    rank's signal must stop all ranks at the same step, which takes an all-reduce; it runs every
    `every_n_steps` optimizer steps (at the same steps on every rank), so a signal is acted on within
    that many steps. Under SLURM (`slurm_requeue`), SIGUSR1 additionally links the checkpoint as
    Lightning's hpc_ckpt_N.ckpt (what a requeued run with ckpt_path=null resumes from) and rank 0 runs
    `scontrol requeue`; Lightning's own SIGUSR1 handler is off (train.build_trainer) because it saves
    inside the signal handler, where the checkpoint's collectives can meet another rank mid-step."""

    def __init__(
        self, last_path: str | Path, slurm_requeue: bool = False, every_n_steps: int = SYNC_EVERY_N_STEPS
    ) -> None:
        self.last_path = Path(last_path)
        self.slurm_requeue = slurm_requeue
        self.every_n_steps = every_n_steps
        self.signals = [signal.SIGTERM, signal.SIGUSR1]
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
        pending = self.received is not None or trainer.received_sigterm  # (before on_train_start: Lightning's flag)
        if trainer.world_size > 1:
            if trainer.global_step % self.every_n_steps:
                return
            pending = trainer.strategy.reduce_boolean_decision(pending, all=False)  # any rank's signal
        if not pending:
            return
        # Ranks that did not receive the signal themselves agree on what to do from the one that did.
        signum = max(_gather(self.received or 0)) or signal.SIGTERM
        log.warning("received signal %d: saving %s at step %d and exiting", signum, self.last_path, trainer.global_step)
        trainer.save_checkpoint(self.last_path)
        if self.slurm_requeue and signum == signal.SIGUSR1:
            self._requeue(trainer)
        raise Preempted(signum)

    def _requeue(self, trainer: L.Trainer) -> None:
        hpc = Path(trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir))
        if trainer.is_global_zero:
            try:  # the same bytes under Lightning's name: no second write in the grace period
                os.link(self.last_path, hpc)
            except OSError:  # a filesystem without hard links
                shutil.copyfile(self.last_path, hpc)
            job = slurm_job_id()
            code = subprocess.call(["scontrol", "requeue", job])
            if code:
                log.warning("scontrol requeue %s failed with exit code %d", job, code)
            else:
                log.warning("requeued SLURM job %s; it resumes from %s", job, hpc)
        trainer.strategy.barrier("imgcls_requeue")

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
    """Non-finite losses, found without a host sync per step, and never in a saved checkpoint.

    Every micro-batch only queues device ops: the first non-finite loss (its step and value) is kept in
    device tensors. The host reads them (one sync) every `every_n_steps` optimizer steps, before every
    checkpoint save (on_save_checkpoint, on every rank, with a check that every floating weight and buffer
    is finite), and at each epoch's end. So a NaN can reach the weights for at most `every_n_steps` steps,
    and never a checkpoint: the save is refused and the run stops naming the step of the first bad loss.

    fp16 AMP (a GradScaler): a step whose gradients overflow is skipped by the scaler, which halves its
    scale. That is normal early in training, so it is counted (train.amp_skipped_steps in report.json), and
    only `max_consecutive_overflows` skipped steps in a row stop the run, with the unscaled loss."""

    def __init__(
        self,
        last_path: str | Path,
        report: ReportCallback | None = None,
        every_n_steps: int = SYNC_EVERY_N_STEPS,
        max_consecutive_overflows: int = 10,
    ) -> None:
        self.last_path = Path(last_path)
        self.report = report
        self.every_n_steps = every_n_steps
        self.max_consecutive_overflows = max_consecutive_overflows
        self.skipped_steps = 0  # as of the last check
        self._dev: dict[str, torch.Tensor] = {}
        self._where: dict[int, tuple[int, int, float]] = {}  # step -> (epoch, batch, lr) since the last check
        self._batch_step = 0
        self._scale_before: torch.Tensor | None = None

    @staticmethod
    def _scaler(trainer: L.Trainer) -> Any:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    def _reset(self, device: torch.device) -> None:
        def full(value: float, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((), value, dtype=dtype, device=device)

        self._dev = {
            "bad_step": full(-1, torch.int64),  # first step with a non-finite loss (-1: none)
            "bad_loss": full(0.0, torch.float32),
            "skipped": full(0, torch.int64),  # optimizer steps the scaler skipped
            "run": full(0, torch.int64),  # ... in a row, now
            "max_run": full(0, torch.int64),  # ... in a row, the longest since the last check
            "last_loss": full(0.0, torch.float32),  # the unscaled loss of the last micro-batch (fp16)
        }
        self._where = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset(pl_module.device)
        self._set_skipped(trainer, pl_module, 0)  # a resumed run's count, from its checkpoint

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_step = trainer.global_step
        if self._batch_step not in self._where:
            lr = trainer.optimizers[0].param_groups[-1]["lr"] if trainer.optimizers else math.nan
            self._where[self._batch_step] = (trainer.current_epoch, batch_idx, lr)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        scaler = self._scaler(trainer)
        if scaler is not None and scaler._scale is not None:  # noqa: SLF001 - the device tensor get_scale() syncs on
            self._scale_before = scaler._scale.detach().clone()  # noqa: SLF001

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._dev:
            self._reset(pl_module.device)
        d = self._dev
        loss = outputs.get("loss_value", outputs.get("loss")) if isinstance(outputs, dict) else outputs
        scaler = self._scaler(trainer)
        if loss is not None:
            loss = loss.detach().float().reshape(-1)[0].to(d["bad_loss"].device)
            bad = ~torch.isfinite(loss)
            if scaler is not None:
                d["last_loss"] = loss  # a device tensor: the message reports it only when the run stops
            else:
                first = bad & (d["bad_step"] < 0)
                d["bad_step"] = torch.where(first, self._batch_step, d["bad_step"])
                d["bad_loss"] = torch.where(first, loss, d["bad_loss"])
        if trainer.global_step == self._batch_step:
            return  # inside an accumulation window
        if scaler is not None and self._scale_before is not None:
            overflowed = getattr(scaler, "overflowed", None)  # a static scale (precision.py StaticGradScaler)
            if overflowed is None:
                overflowed = scaler._scale < self._scale_before  # noqa: SLF001 - a dynamic scale halves on a skip
            skipped = overflowed.to(torch.int64)
            d["skipped"] = d["skipped"] + skipped
            d["run"] = (d["run"] + 1) * skipped
            d["max_run"] = torch.maximum(d["max_run"], d["run"])
            self._scale_before = None
        if trainer.global_step % self.every_n_steps == 0:
            self.check(trainer, pl_module)

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule, weights: dict[str, Any] | None = None) -> None:
        """The one host sync: read the device flags (and with `weights`, a state dict, that its floating tensors
        are finite), agree over ranks, raise TrainingError if any rank saw a fault."""
        if not self._dev:
            return
        d = self._dev
        flags = [d["bad_step"].float(), d["bad_loss"], d["skipped"].float(), d["max_run"].float(), d["last_loss"]]
        finite = torch.ones((), dtype=torch.bool, device=d["bad_loss"].device)
        if weights is not None:
            tensors = [t for t in weights.values() if torch.is_tensor(t) and t.is_floating_point()]
            if tensors:
                finite = torch.stack([torch.isfinite(t).all().to(finite.device) for t in tensors]).all()
        bad_step, bad_loss, skipped, max_run, last_loss, ok = torch.stack([*flags, finite.float()]).tolist()
        fault = bad_step >= 0 or max_run >= self.max_consecutive_overflows or not ok
        # Any rank's fault stops every rank (the others would wait in the next collective).
        if trainer.world_size > 1 and not trainer.strategy.reduce_boolean_decision(fault, all=False):
            fault = False
        self._set_skipped(trainer, pl_module, int(skipped))
        d["skipped"].zero_()
        d["max_run"].copy_(d["run"])
        if not fault:
            self._where = {s: w for s, w in self._where.items() if s >= trainer.global_step}
            return
        kept = f"the last good checkpoint is {self.last_path}" if self.last_path.exists() else "no checkpoint yet"
        if bad_step >= 0:
            step = int(bad_step)
            epoch, batch, lr = self._where.get(step, (trainer.current_epoch, -1, math.nan))
            raise TrainingError(
                f"train.loss is {bad_loss} at step {step} (epoch {epoch}, batch {batch}) with lr {lr:.6g}; "
                f"found at step {trainer.global_step}, nothing after step {step} was saved, {kept} (resume "
                "with ckpt_path=last, e.g. with a lower recipe.lr_per_256)"
            )
        if max_run >= self.max_consecutive_overflows:
            lr = trainer.optimizers[0].param_groups[-1]["lr"] if trainer.optimizers else math.nan
            raise TrainingError(
                f"fp16 gradients overflowed in {int(max_run)} optimizer steps in a row (precision."
                f"max_consecutive_overflows={self.max_consecutive_overflows}) by step {trainer.global_step}, "
                f"train.loss (unscaled) {last_loss}, lr {lr:.6g}; the loss scaler skipped them all, {kept} "
                "(resume with ckpt_path=last, e.g. with a lower recipe.lr_per_256 or precision=fp32)"
            )
        raise TrainingError(
            f"a weight or buffer of the model is not finite at step {trainer.global_step} (the loss was); "
            f"not saved, {kept}"
        )

    def _set_skipped(self, trainer: L.Trainer, pl_module: L.LightningModule, new: int) -> None:
        if self._scaler(trainer) is None:
            return
        if new:
            log.info("AMP loss scaler skipped %d step(s) by step %d", new, trainer.global_step)
        self.skipped_steps += new
        if self.report is not None:
            self.report.counters["train.amp_skipped_steps"] = self.skipped_steps

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Every rank runs this while a checkpoint is assembled, before rank 0 writes it.
        self.check(trainer, pl_module, weights=checkpoint.get("state_dict") or pl_module.state_dict())
        checkpoint.setdefault("callbacks", {})  # state_dict() below ran before this check: refresh the count
        for key, state in checkpoint["callbacks"].items():
            if key == self.state_key:
                state["skipped_steps"] = self.skipped_steps

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module)  # before ReportCallback's row (this callback comes first)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.check(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module)  # a run without checkpoints does not end "successfully" on NaN weights

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
