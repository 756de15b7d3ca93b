"""RUN_DIR/report.json with NVIDIA's metric names, per epoch and for the run, and RUN_DIR/summary.csv: one row per
epoch, the columns a user compares runs by (timm's summary.csv; Lightning's csv/metrics.csv has a row per logging
call, mostly empty cells).

NVIDIA's DLLogger report names (IC/logger.py): train.loss, train.total_ips, train.compute_ips,
train.data_time, train.compute_time, train.lr, val.loss, val.top1, val.top5, val.total_ips,
val.compute_ips. Percentages stay 0-100. The same values go to every Lightning logger. Its epochs count from 0, as
NVIDIA's report does (PYT main.py: Logger(start_epoch=start_epoch - 1), and logger.py's start_epoch adds 1 before
the first epoch); summary.csv, the epoch lines and a sweep's results table count from 1, as a reader does.
report.json also has the best epoch (`best`, numbered as its rows are), the run's wall time (`wall_time_s`, over
every invocation of a resumed run) and the command of its latest invocation (`command`).
The report's rows travel in the checkpoint (callback state), so a resumed run continues the report
consistently with the weights it resumed from.
"""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from imgcls.storage import write_atomic, write_json_atomic
from imgcls.training.timing import StepTimer

# How each metric is summarized over the run (NVIDIA's meters, with MinMeter really a min).
RUN_SUMMARY = {"loss": min, "top1": max, "top5": max, "amp_skipped_steps": max}  # the last is a running total

# summary.csv's columns after `epoch` (counted from 1, as the epoch lines and charts count) and `step`; the EMA's
# only in a run with an EMA copy. wall_time_s: the run's wall time at the row's end (resumed runs continue it).
SUMMARY_COLUMNS = (
    "train.loss", "val.loss", "val.top1", "val.top5", "val_ema.top1", "val_ema.top5", "train.lr", "train.total_ips",
    "val.total_ips", "wall_time_s",
)  # fmt: skip


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row of the best val.top1 (the earliest of equals), None when no epoch was validated."""
    validated = [row for row in rows if row.get("val.top1") is not None]
    return max(validated, key=lambda row: row["val.top1"]) if validated else None


def summary_csv(rows: list[dict[str, Any]]) -> str:
    columns = [c for c in SUMMARY_COLUMNS if not c.startswith("val_ema.") or any(c in row for row in rows)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["epoch", "step", *columns])
    for row in rows:
        writer.writerow([row["epoch"] + 1, row["step"], *("" if row.get(c) is None else row[c] for c in columns)])
    return out.getvalue()


class ReportCallback(L.Callback):
    def __init__(self, run_dir: str | Path, command: str | None = None) -> None:
        self.path = Path(run_dir) / "report.json"
        self.summary_path = Path(run_dir) / "summary.csv"
        self.command = command  # the invocation's command line (epoch_log.run_command), None when not known
        self.rows: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self._wall_before = 0.0  # the wall time of a resumed run's earlier invocations, as of its checkpoint
        self._started: float | None = None  # this invocation's fit start
        self.train = StepTimer()
        self.val = StepTimer()
        self._losses: list[torch.Tensor] = []  # each step's loss, on the device: summed once an epoch, no kernel a step
        self._epoch_written = -1
        self.counters: dict[str, float] = {}  # running figures other callbacks keep (train.amp_skipped_steps)

    def wall_time(self) -> float:
        """Seconds of this run: earlier invocations' (from the checkpoint) and this one's since its fit started."""
        return self._wall_before + (time.perf_counter() - self._started if self._started is not None else 0.0)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started = time.perf_counter()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and self.rows:
            self.write()  # the wall time to the end of fit

    # --- training -------------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.train.reset()
        self._losses = []

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.train.batch_started(pl_module.device)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.train.batch_ended(len(batch[1]), pl_module.device)
        if isinstance(outputs, dict) and "loss_value" in outputs:
            self._losses.append(outputs["loss_value"])

    # --- validation -----------------------------------------------------------------------------
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.val.reset()

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:  # noqa: E501
        self.val.batch_started(pl_module.device)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # noqa: E501
        self.val.batch_ended(len(batch[1]), pl_module.device)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Runs before ModelCheckpoint's hook (Lightning orders checkpoint callbacks last), so the
        # checkpoint saved for this epoch already carries this epoch's row.
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._finish_epoch(trainer, pl_module, with_val=True)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._epoch_written != trainer.current_epoch:  # an epoch without validation
            self._finish_epoch(trainer, pl_module, with_val=False)

    # --- the report -----------------------------------------------------------------------------
    def _finish_epoch(self, trainer: L.Trainer, pl_module: L.LightningModule, with_val: bool) -> None:
        epoch = trainer.current_epoch
        losses = self._losses
        loss_sum = torch.stack([x.float().reshape(()) for x in losses]).sum() if losses else torch.zeros(())
        count = torch.tensor(float(len(losses)))
        loss = torch.stack([loss_sum.to(pl_module.device), count.to(pl_module.device)])
        loss = trainer.strategy.reduce(loss, reduce_op="sum")
        row: dict[str, Any] = {"epoch": epoch, "step": trainer.global_step}
        if loss[1] > 0:
            row["train.loss"] = float(loss[0] / loss[1])
        row.update(self.train.summary("train", trainer.world_size))
        row.update(self.counters)
        row["train.lr"] = trainer.optimizers[0].param_groups[-1]["lr"] if trainer.optimizers else None
        if with_val:
            for key, value in trainer.callback_metrics.items():
                if key.startswith(("val.", "val_ema.")):
                    row[key] = float(value)
            row.update(self.val.summary("val", trainer.world_size))
        row["wall_time_s"] = round(self.wall_time(), 3)
        self.rows = [r for r in self.rows if r["epoch"] < epoch] + [row]
        self._epoch_written = epoch
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                epoch_metrics = {k: v for k, v in row.items() if k.endswith(("_ips", "_time")) or k == "epoch"}
                epoch_metrics["train.loss_epoch"] = row.get("train.loss")
                logger.log_metrics(epoch_metrics, step=trainer.global_step)
            self.write()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        keys = {k for row in self.rows for k in row if "." in k}
        for key in sorted(keys):
            values = [row[key] for row in self.rows if row.get(key) is not None]
            if not values:
                continue
            how = RUN_SUMMARY.get(key.rsplit(".", 1)[1])
            if how is not None:
                out[key] = how(values)
            elif key.endswith("lr"):
                out[key] = values[-1]
            else:
                out[key] = sum(values) / len(values)
        return out

    def write(self) -> None:
        best = best_row(self.rows)
        document = {
            "epochs": self.rows, "run": self.summary(),
            "best": None if best is None else {k: best[k] for k in ("epoch", "step", "val.top1")},
            "wall_time_s": round(self.wall_time(), 3), "command": self.command, **self.extra,
        }  # fmt: skip
        write_json_atomic(self.path, document)
        text = summary_csv(self.rows)
        write_atomic(self.summary_path, lambda tmp: tmp.write_text(text))

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "extra": self.extra, "wall_time_s": self.wall_time()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = list(state_dict.get("rows", []))
        self.extra = dict(state_dict.get("extra", {}))
        self._wall_before = float(state_dict.get("wall_time_s", 0.0))
