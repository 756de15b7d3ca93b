"""Preemption: SIGTERM and SIGUSR1 save last.ckpt at an optimizer-step boundary, the same step on every rank,
and exit with 128 + the signal number; under SLURM, SIGUSR1 also requeues the job.

Lightning's own SIGTERM handling stops only at the end of the epoch on a single process, and raises
mid-validation without a checkpoint; its SLURM SIGUSR1 handler saves inside the signal handler (collectives at
an arbitrary point of another rank's step can hang). Host syncs stay out of the per-step path: under DDP the
flag is agreed on every SYNC_EVERY_N_STEPS optimizer steps.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from imgcls.distributed import SYNC_EVERY_N_STEPS, gather_objects

log = logging.getLogger(__name__)


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
    `scontrol requeue`; Lightning's own SIGUSR1 handler is off (trainer.build_trainer) because it saves
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
        signum = max(gather_objects(self.received or 0)) or signal.SIGTERM
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
