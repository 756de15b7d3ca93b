"""What a training run tells its user in the text log, whatever the progress bar (SLURM logs have no TTY):
one line per epoch, and at the end the best val top-1, the run dir, how to evaluate or resume the run, and
the charts of callbacks/charts.py in RUN_DIR/plots. Rank 0 only; the numbers are the report's rows (report.py)."""

from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from imgcls.callbacks.charts import plot_runs
from imgcls.callbacks.report import ReportCallback, best_row
from imgcls.redaction import redact_overrides
from imgcls.training.checkpoint import best_path, last_path

log = logging.getLogger("imgcls")


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
