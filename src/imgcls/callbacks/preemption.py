"""Preemption: SIGTERM, SIGUSR1 and SIGUSR2 save last.ckpt at an optimizer-step boundary, the same step on
every rank, and exit with 128 + the signal number; under SLURM, SIGUSR1 and SIGUSR2 (submitit's preemption
signal) also requeue the job, and under submitit's local executor (hydra/launcher=submitit_local) they end the
task with the exit code that makes submitit's controller start it again (requeue_by).

The handlers only set a flag, and they are imgcls's for the whole run (`preemption_signals()`, around
imgcls.run.train.run: setup, the DALI build, teardown too), not only inside fit's training loop. Lightning's own
handling is switched off (`without_lightning_signal_handling`): its SIGTERM handler calls dist.broadcast inside
the signal handler, its training loop broadcasts a SIGTERM flag from rank 0 and reads it with .item() at every
training batch under DDP (a host sync per micro-batch), it stops only at the end of the epoch on a single
process, and its SLURM SIGUSR1 handler saves inside the signal handler (collectives at an arbitrary point of
another rank's step can hang). Host syncs stay out of the per-step path: under DDP the flags are all-reduced every
SYNC_EVERY_N_STEPS optimizer steps without waiting, and each such result is read a period later (DeferredRead).

Ctrl-C (SIGINT) is a preemption signal too, for the same run (`_handle_interrupt`): the first one saves last.ckpt at
the next optimizer-step boundary, names the step and the command that resumes it, and exits with 130; a second
one stops at once, without saving. Lightning's own answer to Ctrl-C (a KeyboardInterrupt caught around fit:
"Detected KeyboardInterrupt, attempting graceful shutdown", exit 1, nothing saved) never sees one: Python's
KeyboardInterrupt is not raised while imgcls's handler is in place. A terminal sends Ctrl-C to its whole
foreground process group: every DDP rank that Lightning's launcher started agrees on the step as for SIGTERM, and
the DataLoader's forked workers, which inherit the handler, leave the signal to the process that owns the run.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException

from imgcls.callbacks.epoch_log import resume_command, run_overrides
from imgcls.distributed import SYNC_EVERY_N_STEPS, DeferredRead, gather_objects, is_rank_zero

log = logging.getLogger(__name__)


class Preempted(SIGTERMException):
    """Raised after the checkpoint was saved on a signal; the process exits with 128 + signum (143 for SIGTERM),
    or with `exit_code` (submitit's local requeue)."""

    def __init__(self, signum: int, exit_code: int | None = None) -> None:
        super().__init__(128 + signum if exit_code is None else exit_code)


# The signals a cluster launcher sends before it stops a job that can be requeued: SLURM's `--signal` (USR1) and
# submitit's (USR2; SUBMITIT_PREEMPT_SIGNAL may name another, which is then not one of these).
REQUEUE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def requeue_by() -> str | None:
    """Who requeues this job on a REQUEUE_SIGNALS signal: "slurm" (scontrol requeue), "submitit_local" (submitit's
    local executor restarts a task that exits with its LOCAL_REQUEUE_RETURN_CODE), or None."""
    if SLURMEnvironment.detect():
        return "slurm"
    if os.environ.get("SUBMITIT_LOCAL_JOB_ID"):
        return "submitit_local"
    return None


def restarted_by(env: Mapping[str, str] | None = None) -> str | None:
    """Which launcher restarted this job, when it is a restart: SLURM requeues keep SLURM_JOB_ID and count in
    SLURM_RESTART_COUNT; torchrun's elastic agent counts in TORCHELASTIC_RESTART_COUNT. None for a first start.
    (submitit's local executor counts nothing: its restarts are told by the hpc_ckpt_N its requeue leaves.)"""
    env = os.environ if env is None else env
    for variable, launcher in (("SLURM_RESTART_COUNT", "SLURM requeue"), ("TORCHELASTIC_RESTART_COUNT", "torchrun")):
        count = env.get(variable, "")
        if count.isdigit() and int(count) > 0:
            return f"{launcher} ({variable}={count})"
    return None


def submitit_local_requeue_code() -> int:
    from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE  # present wherever its executor runs this

    return int(LOCAL_REQUEUE_RETURN_CODE)


def slurm_job_id() -> str:
    """The id `scontrol requeue` takes (an array task's is JOBID_TASKID), as Lightning's SLURM handler builds it."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job is not None:
        return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ["SLURM_JOB_ID"]


# The preemption signals: SIGTERM (SLURM's and Kubernetes' stop), SIGUSR1 (`sbatch --signal=SIGUSR1@300`),
# SIGUSR2 (submitit's timeout/preemption signal, hydra/launcher=slurm).
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
_received: list[int] = []  # the signals received since preemption_signals() was entered (handlers only append)
_in_training_loop: list[bool] = [False]  # set by Preemption between on_train_start and on_train_end
_launchers: list[Any] = []  # Lightning's launcher of this run: its child ranks get a signal that stops us early
_owner: list[int] = [0]  # the pid that entered preemption_signals(); processes forked from it leave signals to it


def received_signal() -> int | None:
    """The first preemption signal this process received during the run, or None."""
    return _received[0] if _received else None


def _handle(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _owner[0]:
        return  # a forked DataLoader worker: the run's process saves and stops, then ends its workers
    _received.append(signum)
    if _in_training_loop[0]:
        return  # only a flag: Preemption saves at the next optimizer-step boundary, the same on every rank
    # Before training (setup, the DALI build) or after it (teardown) there is no step to save: stop now, without
    # any collective; a SLURM job is requeued first, to resume from the checkpoint it already has.
    _stop_launched_ranks(signum)
    requeue = requeue_by() if signum in REQUEUE_SIGNALS else None
    if requeue == "slurm" and is_rank_zero():
        requeue_slurm_job()
    raise Preempted(signum, submitit_local_requeue_code() if requeue == "submitit_local" else None)


def _stop_launched_ranks(signum: int) -> None:
    for launcher in _launchers:  # Lightning's SIGTERM handler did this too: ranks >= 1 would wait for rank 0
        if hasattr(launcher, "kill"):
            launcher.kill(signum)


def _say(text: str) -> None:
    """A line on stderr from inside a signal handler: os.write, as the handler may run in the middle of a write
    to sys.stderr's buffer (a second write there raises "reentrant call")."""
    if is_rank_zero():
        os.write(2, f"\n{text}\n".encode())


def _handle_interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C: the first one during training is a preemption signal (saved at the next step boundary); a second
    one, or one before or after training, stops now. A third finds the default action and ends the process."""
    if os.getpid() != _owner[0]:
        return  # a forked DataLoader worker (a terminal's Ctrl-C reaches its whole process group)
    if _in_training_loop[0] and signum not in _received:
        _received.append(signum)
        _say("Ctrl-C: saving last.ckpt at the next step, then exiting (Ctrl-C again: stop now, without saving)")
        return
    _received.append(signum)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _say("Ctrl-C again: stopping now, without saving" if _in_training_loop[0] else "Ctrl-C: stopping")
    _stop_launched_ranks(signal.SIGKILL if _in_training_loop[0] else signum)  # as Lightning ends them on Ctrl-C
    raise Preempted(signum)


def requeue_slurm_job() -> None:
    job = slurm_job_id()
    code = subprocess.call(["scontrol", "requeue", job])
    if code:
        log.warning("scontrol requeue %s failed with exit code %d", job, code)
    else:
        log.warning("requeued SLURM job %s", job)


@contextmanager
def preemption_signals() -> Iterator[None]:
    """imgcls's handlers for the preemption signals, for everything inside (a whole training run), then the
    previous ones again. Outside the main thread (no handlers can be set there) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received.clear()
    _launchers.clear()
    _in_training_loop[0] = False
    _owner[0] = os.getpid()
    previous = {signum: signal.signal(signum, _handle) for signum in PREEMPTION_SIGNALS}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, _handle_interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def without_lightning_signal_handling(trainer: L.Trainer) -> None:
    """Switch off Lightning's signal handlers and its per-batch SIGTERM broadcast (why: the module docstring).
    Both are private Lightning names (2.6): if they move, this fails loudly instead of silently syncing."""
    connector = trainer._signal_connector  # noqa: SLF001
    epoch_loop = trainer.fit_loop.epoch_loop
    if not hasattr(connector, "register_signal_handlers") or not hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
        raise RuntimeError("lightning's signal handling moved: update imgcls/callbacks/preemption.py")
    # Replacing these methods on this trainer's instances is the point (mypy flags any method assignment).
    connector.register_signal_handlers = lambda: None  # type: ignore[method-assign]
    epoch_loop._broadcast_sigterm_tensor = lambda: None  # type: ignore[method-assign]  # noqa: SLF001
    if trainer.strategy.launcher is not None:
        _launchers.append(trainer.strategy.launcher)


class Preemption(L.Callback):
    """A preemption signal's save happens at an optimizer-step boundary, on every rank at the same step.

    Single process: the flag is read at every optimizer step (a Python list, no sync). Under DDP one rank's signal
    must stop all ranks at the same step, which takes an all-reduce; one starts every `every_n_steps` optimizer steps
    (at the same steps on every rank) and is read at the next of those steps, when it has long finished (no host
    sync, no rank waiting at a collective on the step path), so a signal is acted on within twice that many steps,
    at the same step on every rank. When the job can be requeued (`requeue`: requeue_by()), SIGUSR1 and SIGUSR2
    additionally link the checkpoint as Lightning's hpc_ckpt_N.ckpt (what a requeued run with ckpt_path=null resumes
    from) and, under SLURM, rank 0 runs `scontrol requeue`; under submitit's local executor every rank exits with the
    code that makes its controller start the task again. Before training has started and after it has ended there
    is no step to save: the handler (`_handle`) stops the process at once."""

    def __init__(
        self,
        last_path: str | Path,
        requeue: str | None = None,
        every_n_steps: int = SYNC_EVERY_N_STEPS,
        run_dir: str | Path | None = None,
    ) -> None:
        self.last_path = Path(last_path)
        self.run_dir = None if run_dir is None else Path(run_dir)  # for the resume command printed after a save
        self.requeue = requeue
        self.every_n_steps = every_n_steps
        self._step = -1
        self._agreeing: DeferredRead | None = None  # under DDP: any rank's flag, started at the last check

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._step = trainer.global_step
        self._agreeing = None
        _in_training_loop[0] = True

    # Lightning calls on_exception (and not on_train_end) when the loop ends with an exception, Preempted too.
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _in_training_loop[0] = False
        if self._agreeing is not None:  # every rank started it: its collective completes, nothing is left running
            self._agreeing.values()
            self._agreeing = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        _in_training_loop[0] = False

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._step:
            return  # inside a gradient-accumulation window: its partial gradients are not in a checkpoint
        self._step = trainer.global_step
        pending = received_signal() is not None
        if trainer.world_size > 1:
            if trainer.global_step % self.every_n_steps:
                return
            # Any rank's signal, as all-reduced at the previous check; this rank's flag now goes into the next one.
            # A device tensor filled from the flag, not made from it: torch.tensor(flag, device=...) is a copy from
            # the host that waits for the device's queue.
            agreed = self._agreeing is not None and self._agreeing.values()[0] > 0
            self._agreeing = None
            if not agreed:
                flag = torch.full((1,), float(pending), device=pl_module.device)
                self._agreeing = DeferredRead(flag, over_ranks=True)
            pending = agreed
        if not pending:
            return
        # Ranks that did not receive the signal themselves agree on what to do from the one that did.
        signum = max(gather_objects(received_signal() or 0)) or signal.SIGTERM
        log.warning("received signal %d: saving %s at step %d and exiting", signum, self.last_path, trainer.global_step)
        trainer.save_checkpoint(self.last_path, weights_only=False)  # (None: Lightning logs that it chose this)
        if self.requeue is not None and signum in REQUEUE_SIGNALS:
            self._requeue(trainer)
            if self.requeue == "submitit_local":
                raise Preempted(signum, submitit_local_requeue_code())
        elif trainer.is_global_zero and self.run_dir is not None:
            log.warning("saved step %d; resume: %s", trainer.global_step, resume_command(self.run_dir,
                        run_overrides(self.run_dir)))  # fmt: skip
        raise Preempted(signum)

    def _requeue(self, trainer: L.Trainer) -> None:
        hpc = Path(trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir))
        if trainer.is_global_zero:
            try:  # the same bytes under Lightning's name: no second write in the grace period
                os.link(self.last_path, hpc)
            except OSError:  # a filesystem without hard links
                shutil.copyfile(self.last_path, hpc)
            if self.requeue == "slurm":
                requeue_slurm_job()
            log.warning("the requeued job resumes from %s", hpc)
        trainer.strategy.barrier("imgcls_requeue")
