"""Host syncs a training and a validation step, counted on CUDA (`callbacks.count_host_syncs`, what
`make gpu-check` sets on its training rows).

torch's CUDA sync debug mode warns at each synchronizing call (`.item()`, a device-to-host copy, a stream
sync); ThreadSyncCounter counts those of the thread that runs the steps. A phase is counted from its first batch's
start hook to its last batch's end hook, the gaps between its batches included (the data fetch, every callback's
batch hooks), so a sync any step pays shows; the epoch ends (the report's all-reduce, a checkpoint save, the
metrics' compute) and Lightning's sanity check are outside every window: they are once an epoch, not a step.
report.json then holds train.host_syncs_per_step and val.host_syncs_per_step. Off by default: with the debug mode
on, every is_pinned check of the pin-memory thread raises a Python warning (dropped, but paid for).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import lightning as L
import torch

from imgcls.callbacks.report import ReportCallback

SYNC_WARNING = "synchronizing CUDA operation"  # torch.cuda.set_sync_debug_mode("warn")'s message


class ThreadSyncCounter:
    """Counts the warnings containing `marker` that the thread which called start() raises until stop().

    The warning machinery is process-wide: with every warning recorded, the DataLoader's pin-memory thread (an
    is_pinned check per tensor per batch) made 481 of 495 counted syncs on one H200, none of them in the training
    step. Other threads' warnings, and this thread's other warnings, are dropped while counting: shown, the
    "always" filter would print one per batch."""

    def __init__(self, marker: str = SYNC_WARNING) -> None:
        self.marker = marker
        self.count = 0
        self._catcher: warnings.catch_warnings | None = None
        self._thread: int | None = None

    @property
    def counting(self) -> bool:
        return self._catcher is not None

    def start(self) -> None:
        self.count = 0
        self._thread = threading.get_ident()
        self._catcher = warnings.catch_warnings()  # puts the filters and showwarning back at stop()
        self._catcher.__enter__()
        warnings.simplefilter("always")  # every occurrence, not once per call site
        warnings.showwarning = self._show

    def stop(self) -> int:
        if self._catcher is not None:
            self._catcher.__exit__(None, None, None)
            self._catcher = None
        return self.count

    def _show(self, message: Warning | str, *args: Any, **kwargs: Any) -> None:
        if threading.get_ident() == self._thread and self.marker in str(message):
            self.count += 1


TRAIN, VAL = "train", "val"


class HostSyncCount(L.Callback):
    """train.host_syncs_per_step and val.host_syncs_per_step of the whole run, in the report's rows.

    Put it last among the callbacks: its batch-end hook then runs after every other callback's, so their syncs
    count. `debug_mode`: switch torch's CUDA sync debug mode on and off (False: the warnings come from elsewhere,
    e.g. a test raising them as torch would on a GPU)."""

    def __init__(self, report: ReportCallback, debug_mode: bool = True) -> None:
        self.report = report
        self.debug_mode = debug_mode
        self.counter = ThreadSyncCounter()
        self.syncs = {TRAIN: 0, VAL: 0}
        self.steps = {TRAIN: 0, VAL: 0}
        self._phase: str | None = None  # the phase whose batch ended last; None after a phase's end
        self._mark = 0  # the counter at the last batch end (or at this phase's first batch start)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if pl_module.device.type != "cuda" and self.debug_mode:
            return  # the debug mode exists for CUDA only: nothing to count
        self.counter.start()
        if self.debug_mode:
            torch.cuda.set_sync_debug_mode("warn")

    def _stop(self) -> None:
        if self.counter.counting:
            if self.debug_mode:
                torch.cuda.set_sync_debug_mode("default")
            self.counter.stop()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop()  # the debug mode and the warning filters back as they were

    def _begin(self, phase: str) -> None:
        if self._phase != phase:  # the phase's first batch: what ran since the other phase is not a step's
            self._mark = self.counter.count
            self._phase = phase

    def _end(self, phase: str) -> None:
        self.syncs[phase] += self.counter.count - self._mark
        self.steps[phase] += 1
        self._mark = self.counter.count
        self.report.counters[f"{phase}.host_syncs_per_step"] = self.syncs[phase] / self.steps[phase]

    # A phase's end: the next batch starts a new window (what ran in between is an epoch end, not a step).
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._phase = None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._phase = None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._phase = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.counter.counting:
            self._begin(TRAIN)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.counter.counting:
            self._end(TRAIN)

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.counter.counting and not trainer.sanity_checking:
            self._begin(VAL)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.counter.counting and not trainer.sanity_checking:
            self._end(VAL)
