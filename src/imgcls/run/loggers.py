"""Lightning loggers from the `logger` config group, all writing under the run dir."""

from __future__ import annotations

import csv
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities.rank_zero import rank_zero_only

if TYPE_CHECKING:
    from imgcls.config.schema import LoggerSchema, LoggerWandbSchema


def build_loggers(cfg: LoggerSchema, run_dir: str | Path) -> list[Logger]:
    """A logger for each key of the group that is set (null: off)."""
    run_dir = Path(run_dir)
    loggers: list[Logger] = []
    # A fixed version dir so that a resumed run appends to the same files instead of a new version.
    if cfg.csv is not None:
        loggers.append(ResumableCSVLogger(save_dir=str(run_dir), name="", version="csv"))
    if cfg.tensorboard is not None:
        loggers.append(TensorBoardLogger(save_dir=str(run_dir), name="", version="tensorboard"))
    if cfg.wandb is not None:
        loggers.append(_wandb(cfg.wandb, run_dir))
    return loggers


def _wandb(cfg: LoggerWandbSchema, run_dir: Path) -> WandbLogger:
    """The W&B run id lives in the run dir, so a resumed run continues the same W&B run."""
    id_file = run_dir / "wandb_id.txt"
    if id_file.exists():
        run_id = id_file.read_text().strip()
    else:
        run_id = uuid.uuid4().hex[:8]  # W&B ids are short lowercase alphanumerics
        if _is_rank_zero():
            run_dir.mkdir(parents=True, exist_ok=True)
            id_file.write_text(run_id + "\n")
    logger = WandbLogger(
        project=cfg.project,
        entity=cfg.entity,
        name=cfg.name or run_dir.name,  # null: the run dir's name
        save_dir=str(run_dir),
        offline=cfg.offline,
        log_model=cfg.log_model,
        tags=list(cfg.tags),
        id=run_id,
        resume="allow",
    )
    # Lightning hands wandb.init anonymous=None, which W&B answers with a deprecation warning a user cannot act on.
    logger._wandb_init.pop("anonymous", None)
    return logger


def _is_rank_zero() -> bool:
    # Lightning sets `rank` on the rank_zero_only function when it is imported; its type is a plain function's.
    return rank_zero_only.rank == 0  # type: ignore[attr-defined]


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer deletes an existing metrics.csv when it starts; a resumed run must
    append to it instead, with the header it already has."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = sorted(next(csv.reader(file), []))


class ResumableCSVLogger(CSVLogger):
    _experiment: _AppendingWriter | None  # the only writer this logger makes (experiment, below)

    @property
    def experiment(self) -> _AppendingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def close_loggers(loggers: list[Logger]) -> None:
    """Finish W&B runs (Lightning leaves them open): a sweep's next job then starts a fresh run, and
    offline runs get their summary written."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and _is_rank_zero() and logger._experiment is not None:
            logger.experiment.finish()
