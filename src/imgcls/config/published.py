"""NVIDIA's published runs: the one table of their numbers, and what the configs and the plan read from it.

src/imgcls/config/published_runs.csv holds one row per published measurement of NVIDIA's PyTorch, TF1 and TF2
ConvNets READMEs (DeepLearningExamples 729963dd): the run (framework, model, hardware profile, precision, GPUs,
epochs), the per-GPU batch of the TF scripts, the val top-1 (and its spread over seeds where printed), the time to
train, the training img/s, and `source`, the file:line of every number in NVIDIA's repository. A row with an
`experiment` is conf/experiment/<experiment>.yaml's run; a row without one is a throughput or time NVIDIA
published for a machine or GPU count no experiment trains on (mode=plan scales with it). A PyTorch run's batch is
configs.yml's, which conf/hardware holds for every model, machine and precision (published or not), so the table
leaves it blank there, except for the one run whose script used another (the DGX-2 FP32 50E run of git
history). A row of precision `qat` is a QAT result (recipe=qat_<model> on a trained network; `epochs` the QAT
epochs): NVIDIA published no time or throughput for those. tests/test_published_runs.py checks the table against
docs/reference and that no config or module types in a number it holds.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from imgcls.errors import ConfigError

TABLE = Path(__file__).resolve().parent / "published_runs.csv"
TEXT = ("experiment", "framework", "model", "hardware", "precision", "source")  # the columns that are not numbers
FIELDS = ("batch", "expected")  # what ${imgcls.published:NAME,FIELD} gives an experiment


@dataclass(frozen=True)
class Run:
    experiment: str | None
    framework: str  # pytorch | tf1 | tf2
    model: str  # imgcls model name
    hardware: str  # imgcls hardware profile
    precision: str
    gpus: int
    epochs: int | None
    batch: int | None  # per GPU (TF scripts; the PyTorch runs' is conf/hardware's)
    top1: float | None
    top1_std: float | None
    hours: float | None  # time to train `epochs` on `gpus` GPUs
    img_s: int | None  # training throughput on `gpus` GPUs
    source: str  # NVIDIA's file:line of each number of the row


def _number(cell: str) -> int | float | None:
    """A cell as written: empty is None, 3 an int, 49.0 and 77.12 floats (an experiment's `hours: 3` stays 3)."""
    if cell == "":
        return None
    return float(cell) if "." in cell else int(cell)


@cache
def runs() -> tuple[Run, ...]:
    with TABLE.open(newline="") as f:
        return tuple(_run(row) for row in csv.DictReader(f))


def _run(row: dict[str, str]) -> Run:
    """One row of the table: the text columns as written (an empty experiment is None), the others numbers."""
    fields: dict[str, Any] = {key: cell if key in TEXT else _number(cell) for key, cell in row.items()}
    return Run(**fields | {"experiment": row["experiment"] or None})


@cache
def _by_experiment() -> dict[str, Run]:
    return {run.experiment: run for run in runs() if run.experiment}


def run_of(experiment: str) -> Run:
    """The published run of conf/experiment/<experiment>.yaml."""
    run = _by_experiment().get(experiment)
    if run is None:
        raise ConfigError(f"experiment={experiment} has no row in {TABLE.name} (NVIDIA's published runs)")
    return run


def expected(run: Run) -> dict[str, Any]:
    """An experiment's `expected` block: NVIDIA's top-1 (mean over seeds), its spread, the time to train and,
    for the PyTorch runs, the machine of that time (mode=plan scales it to yours by NVIDIA's img/s)."""
    block: dict[str, Any] = {"top1": run.top1, "top1_std": run.top1_std, "hours": run.hours}
    if run.framework == "pytorch":  # NVIDIA publishes training img/s for its PyTorch runs only
        block["published_on"] = {"model": run.model, "hardware": run.hardware, "precision": run.precision,
                                 "gpus": run.gpus}  # fmt: skip
    return block


def resolve(experiment: str, field: str) -> int | DictConfig | None:
    """${imgcls.published:NAME,FIELD}: FIELD (batch or expected) of experiment NAME's published run; `expected`
    as a config node (a resolver's plain dict would reach cfg.expected.published_on as a dict)."""
    if field not in FIELDS:
        raise ConfigError(f"${{imgcls.published:{experiment},{field}}}: field={field}; allowed: {', '.join(FIELDS)}")
    run = run_of(experiment)
    return OmegaConf.create(expected(run)) if field == "expected" else run.batch


@cache
def throughput_table() -> dict[tuple[str, str, str], dict[int, int]]:
    """{(model, hardware, precision): {GPUs: img/s}}: NVIDIA's PyTorch training throughput (21.03 container)."""
    table: dict[tuple[str, str, str], dict[int, int]] = {}
    for run in runs():
        if run.img_s is not None:
            table.setdefault((run.model, run.hardware, run.precision), {})[run.gpus] = run.img_s
    return table


def throughput(model: str, hardware: str, precision: str, gpus: int) -> float | None:
    """img/s NVIDIA measured for this model on `gpus` GPUs of this machine; between two published GPU counts (or
    past the largest), the per-GPU rate of the largest published count not above `gpus`, times `gpus`. None
    when NVIDIA published no row for the model, machine and precision."""
    rows = throughput_table().get((model, hardware, precision))
    if not rows or gpus < 1:
        return None
    if gpus in rows:
        return float(rows[gpus])
    below = max(n for n in rows if n <= gpus)
    return rows[below] / below * gpus


def scaled_hours(
    hours: float, published: tuple[str, str, str, int], planned: tuple[str, str, str, int]
) -> float | None:
    """NVIDIA's training time for `published` (model, hardware, precision, GPUs) scaled to `planned` by the ratio of
    NVIDIA's throughputs: an estimate (the same epochs and images; data loading and scaling as NVIDIA's)."""
    here, there = throughput(*planned), throughput(*published)
    return None if here is None or there is None else hours * there / here


FRAMEWORKS = {"pytorch": "NVIDIA PyTorch", "tf1": "NVIDIA TensorFlow 1", "tf2": "NVIDIA TensorFlow 2"}


def markdown(framework: str) -> str:
    """The experiments of one framework as a Markdown table (docs/recipes.md holds this text; a test keeps them
    equal): what `python -m imgcls.config.published` prints."""
    lines = [
        "| experiment | GPUs | epochs | top-1 % | time to train | NVIDIA's source |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for run in sorted(runs(), key=lambda r: r.experiment or ""):
        if run.experiment and run.framework == framework:
            top1 = "–" if run.top1 is None else f"{run.top1}" + (f" ± {run.top1_std}" if run.top1_std else "")
            hours = "–" if run.hours is None else f"{run.hours} h"
            lines.append(f"| `{run.experiment}` | {run.gpus} | {run.epochs} | {top1} | {hours} | {run.source} |")
    return "\n".join(lines) + "\n"


QAT = "qat"  # the precision column of NVIDIA's QAT results


def qat_markdown() -> str:
    """NVIDIA's PyTorch QAT results by the recipe that fine-tunes as NVIDIA's quant scripts (docs/recipes.md holds
    this text too)."""
    lines = [
        "| recipe | GPUs | QAT epochs | QAT top-1 % | NVIDIA's source |",
        "|---|---:|---:|---:|---|",
    ]
    for run in sorted((r for r in runs() if r.precision == QAT), key=lambda r: r.model):
        lines.append(f"| `qat_{run.model}` | {run.gpus} | {run.epochs} | {run.top1} | {run.source} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for name, title in FRAMEWORKS.items():
        print(f"{title}:\n\n{markdown(name)}")
    print(f"NVIDIA PyTorch QAT:\n\n{qat_markdown()}")
