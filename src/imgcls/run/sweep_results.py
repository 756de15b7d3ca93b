"""The results of a sweep (`train.py -m`), in one table: SWEEP_DIR/results.csv, also printed when it ends.

One row per job: its overrides (those not shared by every job), best val top-1 and the epoch it came at (counted
from 1, as the epoch lines count), the epochs it trained, its exit code (0, or the code it would have exited with
alone: 2 input, 3 training, 4 storage, 1 an unexpected error) and its run dir.

A Hydra callback (conf/hydra/default.yaml). Each job writes its exit code into its run dir (RUN_DIR/sweep_job.json)
as it ends, in the process that ran it, and the table is made from the run dirs when the sweep ends (Hydra's
.hydra/hydra.yaml: the job's number and overrides; report.json; sweep_job.json): under a launcher that runs each
job as its own process (hydra/launcher=slurm) the sweep's process holds nothing of them. A job whose process died
(killed, out of memory) wrote no exit code: its cell is empty.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from imgcls.distributed import is_rank_zero
from imgcls.redaction import redact_overrides
from imgcls.storage import write_atomic, write_json_atomic

# (line, exit code) per multirun job that ended with a user error (imgcls.cli.guarded appends to it); train_main
# exits with the highest code.
SWEEP_FAILURES: list[tuple[str, int]] = []

JOB_FILE = "sweep_job.json"
RESULTS_FILE = "results.csv"
COLUMNS = ("job", "overrides", "best val.top1", "best epoch", "epochs", "exit code", "run dir")

log = logging.getLogger(__name__)


def _multirun(config: DictConfig) -> bool:
    return OmegaConf.select(config, "hydra.mode") == RunMode.MULTIRUN


class SweepResults(Callback):
    def __init__(self) -> None:
        self._failures_before = 0

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._failures_before = len(SWEEP_FAILURES)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not _multirun(config) or not is_rank_zero():  # each rank of a multi-GPU job (slurm) runs this hook
            return
        failures = SWEEP_FAILURES[self._failures_before :]
        error, code = failures[-1] if failures else (None, 0)
        if job_return.status == JobStatus.FAILED:  # an exception other than a user error (a traceback follows)
            try:
                job_return.return_value  # noqa: B018 - it raises the job's exception
            except Exception as exc:  # noqa: BLE001 - only named here
                error, code = f"{type(exc).__name__}: {exc}", 1
        write_json_atomic(Path(str(config.hydra.runtime.output_dir)) / JOB_FILE, {"exit_code": code, "error": error})

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        rows = sweep_rows(sweep_dir)
        if not rows:
            return
        text = results_csv(rows)
        write_atomic(sweep_dir / RESULTS_FILE, lambda tmp: tmp.write_text(text))
        print(results_table(rows), flush=True)
        print(f"sweep results: {sweep_dir / RESULTS_FILE}", flush=True)


def sweep_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job run dir under sweep_dir (one with Hydra's .hydra/hydra.yaml), in job order."""
    jobs = []
    for hydra_file in sweep_dir.rglob(".hydra/hydra.yaml"):
        try:
            hydra = OmegaConf.load(hydra_file).hydra
            jobs.append(
                (int(hydra.job.num), redact_overrides(str(o) for o in hydra.overrides.task), hydra_file.parent.parent)
            )
        except Exception:  # noqa: BLE001 - a file Hydra did not finish writing: not a job's
            log.warning("sweep results: %s is unreadable; its job is left out", hydra_file)
    jobs.sort()
    shared = set.intersection(*(set(overrides) for _, overrides, _ in jobs)) if len(jobs) > 1 else set()
    rows = []
    for job, overrides, run_dir in jobs:
        best, epochs = _best(run_dir)
        rows.append({
            "job": job,
            "overrides": " ".join(o for o in overrides if o not in shared),
            "best val.top1": None if best is None else float(best["val.top1"]),
            "best epoch": None if best is None else int(best["epoch"]) + 1,
            "epochs": epochs,
            "exit code": _exit_code(run_dir),
            "run dir": str(run_dir),
        })  # fmt: skip
    return rows


def _exit_code(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / JOB_FILE).read_text())["exit_code"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # the job's process ended before its end (killed)


def _best(run_dir: Path) -> tuple[dict[str, Any] | None, int]:
    """The report's row of the best val.top1 (None if no epoch was validated) and the number of epochs trained."""
    try:
        rows = json.loads((run_dir / "report.json").read_text())["epochs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, 0
    # callbacks.report.best_row's rule, not imported: this module loads with the command line, before torch
    validated = [row for row in rows if row.get("val.top1") is not None]
    return (max(validated, key=lambda row: row["val.top1"]) if validated else None), len(rows)


def results_csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["" if row[c] is None else row[c] for c in COLUMNS])
    return out.getvalue()


def results_table(rows: list[dict[str, Any]]) -> str:
    """The rows as aligned text columns, best val.top1 with two decimals (as the epoch lines print it)."""
    cells = [list(COLUMNS)]
    for row in rows:
        top1 = row["best val.top1"]
        values = {**row, "best val.top1": None if top1 is None else f"{top1:.2f}"}
        cells.append(["-" if values[c] is None else str(values[c]) for c in COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in cells)
