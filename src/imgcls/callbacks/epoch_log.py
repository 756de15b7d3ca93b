"""What a training run tells its user in the text log, whatever the progress bar (SLURM logs have no TTY):
a progress line every `callbacks.log_every_n_steps` optimizer steps (ProgressLines), one line per epoch, and at
the end the best val top-1, the run dir, how to evaluate or resume the run, and the charts of callbacks/charts.py
in RUN_DIR/plots. Rank 0 only; the epoch lines' numbers are the report's rows (report.py)."""

from __future__ import annotations

import logging
import math
import shlex
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from imgcls.callbacks.charts import plot_runs
from imgcls.callbacks.report import ReportCallback, best_row
from imgcls.distributed import DeferredRead
from imgcls.redaction import redact_overrides
from imgcls.training.checkpoint import best_path, last_path
from imgcls.training.scheduler import total_steps

log = logging.getLogger("imgcls")
# The progress lines' own logger: a progress bar drawn on a terminal keeps them off the console (it shows the same
# loss itself) and they still reach the run's log file (callbacks/console.py).
PROGRESS_LOGGER = "imgcls.progress"
progress_log = logging.getLogger(PROGRESS_LOGGER)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def epoch_line(row: dict[str, Any], epochs: int, seconds: float, remaining: int) -> str:
    """`epoch 3/90  train.loss 2.3456  val.top1 45.67  val.top5 70.12  1234 img/s  0:05:00  ETA 7:15:00`."""
    parts = [f"epoch {row['epoch'] + 1}/{epochs}"]
    if row.get("train.loss") is not None:
        parts.append(f"train.loss {row['train.loss']:.4f}")
    for key in ("val.top1", "val.top5"):
        if row.get(key) is not None:
            parts.append(f"{key} {row[key]:.2f}")
    if row.get("train.total_ips"):
        parts.append(f"{row['train.total_ips']:.0f} img/s")
    parts += [_duration(seconds), f"ETA {_duration(seconds * remaining)}"]
    return "  ".join(parts)


def progress_line(fields: dict[str, Any], loss: float | None) -> str:
    """`step 40/1250  epoch 1/5  loss 2.3026  lr 0.0125  1234 img/s  data 2.1 ms  ETA 0:12:34` (NVIDIA's
    print_freq line: loss, LR, img/s, data time; the step count and ETA as timm's and the epoch lines')."""
    step = f"step {fields['step']}" + (f"/{fields['steps']}" if fields.get("steps") else "")
    parts = [step, f"epoch {fields['epoch']}/{fields['epochs']}"]
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    if fields.get("lr") is not None:
        parts.append(f"lr {fields['lr']:.4g}")
    parts += [f"{fields['ips']:.0f} img/s", f"data {fields['data_ms']:.1f} ms"]
    if fields.get("eta") is not None:
        parts.append(f"ETA {_duration(fields['eta'])}")
    return "  ".join(parts)


class ProgressLines(L.Callback):
    """One progress_line every `every_n_steps` optimizer steps (NVIDIA's print_freq), rank 0 only, for the logs
    that a progress bar never reaches (SLURM, a pipe, `| tee`, the run's log file): between two epoch lines of a
    large run there are many minutes.

    No host sync on any step. The host figures (LR, img/s, data wait, ETA) are read when the interval ends; the
    loss is rank 0's mean over the interval's micro-batches, from the loss tensors the step returns: one small
    kernel on the logging step, its value copied off the device there without waiting (DeferredRead) and read, and
    the line printed, at the next micro-batch, whose wait is for work queued a step earlier. The last line of an
    epoch is printed before its validation. `loss()`, the latest line's, is what a progress bar shows."""

    def __init__(self, epochs: int, every_n_steps: int) -> None:
        self.epochs = int(epochs)
        self.every_n_steps = int(every_n_steps)
        self.latest_loss: float | None = None
        self._pending: tuple[DeferredRead | None, dict[str, Any]] | None = None
        self._losses: list[torch.Tensor] = []
        self._step = -1
        self._total: int | None = None  # the recipe's optimizer steps (the scheduler's count)
        self._stop: float = 0.0  # this invocation's last step (trainer.max_steps, max_epochs)
        self._steps_per_epoch: float = math.inf
        self._val_start: float | None = None
        self._val_seconds = 0.0  # the latest validation's: the ETA counts the validations still to come
        self._reset(time.perf_counter())

    def _reset(self, now: float) -> None:
        self._interval_start = now
        self._interval_step = self._step
        self._not_training = 0.0  # validation time inside the interval: not in img/s or the time a step takes
        self._samples = 0
        self._batches = 0
        self._data_wait = 0.0
        self._batch_end = now
        self._losses = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        try:
            self._total = total_steps(trainer, self.epochs)
        except (AttributeError, TypeError, ValueError):  # a loader without a length: no total, no ETA
            self._total = None
        self._stop = float(trainer.estimated_stepping_batches)
        batches = trainer.num_training_batches  # inf for a loader without a length
        self._steps_per_epoch = (
            math.ceil(batches / trainer.accumulate_grad_batches) if math.isfinite(batches) else batches
        )
        self._step = trainer.global_step
        self._reset(time.perf_counter())

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batch_end = time.perf_counter()  # validation and the epoch's start are not the loader's wait

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.is_global_zero:
            self._data_wait += time.perf_counter() - self._batch_end

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        now = time.perf_counter()
        self._batch_end = now
        self._samples += len(batch[1])
        self._batches += 1
        if isinstance(outputs, dict) and "loss_value" in outputs:
            self._losses.append(outputs["loss_value"])  # a reference: no kernel, no copy
        self._print_pending()  # the previous micro-batch's line: its loss was copied off the device then
        if trainer.global_step == self._step:
            return  # inside a gradient-accumulation window
        self._step = trainer.global_step
        if self._step % self.every_n_steps:
            return
        seconds = max(now - self._interval_start - self._not_training, 1e-9)
        lr = trainer.optimizers[0].param_groups[-1]["lr"] if trainer.optimizers else None
        fields = {
            "step": self._step, "steps": self._total, "epoch": trainer.current_epoch + 1, "epochs": self.epochs,
            "lr": None if lr is None else float(lr), "ips": trainer.world_size * self._samples / seconds,
            "data_ms": 1000 * self._data_wait / max(self._batches, 1),
            "eta": self._eta(trainer.current_epoch, seconds / max(self._step - self._interval_step, 1)),
        }  # fmt: skip
        read = None
        if self._losses:
            mean = torch.stack([loss.detach().float().reshape(()) for loss in self._losses]).mean()
            read = DeferredRead(mean.reshape(1), over_ranks=False)
        self._pending = (read, fields)
        self._reset(now)

    def loss(self) -> float | None:
        return self.latest_loss

    def _eta(self, epoch: int, step_seconds: float) -> float | None:
        """This invocation's remaining steps at the interval's pace, and its remaining validations (this epoch's
        too) at the latest one's length."""
        if not math.isfinite(self._stop) or not math.isfinite(self._steps_per_epoch):
            return None
        epochs_left = max(math.ceil(self._stop / max(self._steps_per_epoch, 1)) - epoch, 0)
        return step_seconds * max(self._stop - self._step, 0) + self._val_seconds * epochs_left

    def _print_pending(self) -> None:
        if self._pending is None:
            return
        read, fields = self._pending
        self._pending = None
        if read is not None:
            self.latest_loss = float(read.values()[0])
        progress_log.info("%s", progress_line(fields, None if read is None else self.latest_loss))

    # The last interval of an epoch, printed before its validation and epoch line; of the run, before its end.
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.is_global_zero:
            self._print_pending()
            self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_start is not None:
            self._val_seconds = time.perf_counter() - self._val_start
            self._not_training += self._val_seconds
            self._val_start = None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._print_pending()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._print_pending()


def resume_command(run_dir: Path, overrides: list[str]) -> str:
    """train.py with the run's own overrides, its run dir and ckpt_path=last (what a requeued job runs)."""
    kept = [o for o in overrides if not o.startswith(("hydra.run.dir=", "ckpt_path="))]
    return shlex.join(["python", "train.py", *kept, f"hydra.run.dir={run_dir}", "ckpt_path=last"])


def run_command(run_dir: Path) -> str | None:
    """`python train.py` with this invocation's overrides (a sweep job's own: it reruns that job alone); None
    without a record of them (imgcls.run.train.run called from Python)."""
    if not HydraConfig.initialized() and not (run_dir / ".hydra" / "overrides.yaml").is_file():
        return None
    return shlex.join(["python", "train.py", *run_overrides(run_dir)])


def run_overrides(run_dir: Path) -> list[str]:
    """The command-line overrides of this run: Hydra's record of them when Hydra started the run, credentials as
    *** (they are printed and written into report.json)."""
    if HydraConfig.initialized():
        return redact_overrides(HydraConfig.get().overrides.task)
    saved = run_dir / ".hydra" / "overrides.yaml"
    return redact_overrides(str(o) for o in OmegaConf.load(saved)) if saved.is_file() else []


class EpochLog(L.Callback):
    """After ReportCallback in the callback list: it reads the row the report has just made."""

    def __init__(
        self,
        report: ReportCallback,
        run_dir: str | Path,
        epochs: int,
        plots: bool = True,
        data_args: list[str] | None = None,
    ) -> None:
        self.report = report
        self.run_dir = Path(run_dir)
        self.epochs = int(epochs)
        self.plots = plots
        self.data_args = list(data_args or [])  # what the closing `evaluate:` line adds to ckpt=
        self._logged = -1
        self._started = time.perf_counter()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.perf_counter()

    def _log_row(self, trainer: L.Trainer) -> None:
        if not self.report.rows or not trainer.is_global_zero:
            return
        row = self.report.rows[-1]
        if row["epoch"] == self._logged:
            return
        self._logged = row["epoch"]
        max_epochs = trainer.max_epochs
        stop = max_epochs if max_epochs is not None and max_epochs > 0 else self.epochs  # this invocation's end
        last_epoch = min(self.epochs, stop)
        seconds = time.perf_counter() - self._started
        log.info("%s", epoch_line(row, self.epochs, seconds, max(0, last_epoch - row["epoch"] - 1)))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log_row(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_row(trainer)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        best = best_row(self.report.rows)
        if best is not None:
            log.info("best val.top1 %.2f at epoch %d of %d", best["val.top1"], best["epoch"] + 1, len(self.report.rows))
        log.info("run dir %s", self.run_dir)
        ckpt = best_path(self.run_dir) if best_path(self.run_dir).exists() else last_path(self.run_dir)
        if ckpt.exists():
            log.info("evaluate: %s", shlex.join(["python", "evaluate.py", f"ckpt={ckpt}", *self.data_args]))
            log.info("resume:   %s", resume_command(self.run_dir, run_overrides(self.run_dir)))
        if self.plots and self.report.rows:
            try:
                plot_runs([self.run_dir], self.run_dir / "plots")
            except Exception as exc:  # noqa: BLE001 - a chart must never fail a finished training run
                log.warning("could not draw the charts of %s (%s: %s)", self.run_dir, type(exc).__name__, exc)
            else:
                log.info("charts:   %s", self.run_dir / "plots")
