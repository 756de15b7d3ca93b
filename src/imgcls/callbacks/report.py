"""RUN_DIR/report.json with NVIDIA's metric names, per epoch and for the run.

NVIDIA's DLLogger report names (IC/logger.py): train.loss, train.total_ips, train.compute_ips,
train.data_time, train.compute_time, train.lr, val.loss, val.top1, val.top5, val.total_ips,
val.compute_ips. Percentages stay 0-100. The same values go to every Lightning logger.
The report's rows travel in the checkpoint (callback state), so a resumed run continues the report
consistently with the weights it resumed from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch

from imgcls.storage import write_json_atomic
from imgcls.timing import StepTimer

# How each metric is summarized over the run (NVIDIA's meters, with MinMeter really a min).
RUN_SUMMARY = {"loss": min, "top1": max, "top5": max, "amp_skipped_steps": max}  # the last is a running total


class ReportCallback(L.Callback):
    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "report.json"
        self.rows: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.train = StepTimer()
        self.val = StepTimer()
        self._losses: list[torch.Tensor] = []  # each step's loss, on the device: summed once an epoch, no kernel a step
        self._epoch_written = -1
        self.counters: dict[str, int] = {}  # running totals other callbacks keep (train.amp_skipped_steps)

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
        document = {"epochs": self.rows, "run": self.summary(), **self.extra}
        write_json_atomic(self.path, document)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "extra": self.extra}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.rows = list(state_dict.get("rows", []))
        self.extra = dict(state_dict.get("extra", {}))
