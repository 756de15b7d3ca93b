"""PNG charts of one or more runs from their report.json: drawn at the end of a run (callbacks/epoch_log.py) and by
`python -m imgcls.plot` (imgcls/plot.py).

loss.png (train and val, on a log scale), accuracy.png (val top-1 and top-5) and throughput.png (train and val img/s)
per epoch; lr.png at every step the run logged its LR (csv/metrics.csv, each trainer.log_every_n_steps optimizer
steps) as well as at each epoch's end, so that a warm-up shows as the ramp it is; every run overlaid in its own colour.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import matplotlib
from PIL import Image

from imgcls.errors import DataError

matplotlib.use("Agg")  # files only: no display on servers
import matplotlib.pyplot as plt  # noqa: E402 - after the backend choice
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

SOFTWARE = "imgcls.plot"  # the PNG text that marks a chart as ours (check_replaceable)

# chart file -> (title, y label, [(report key, line style)])
CHARTS: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "loss": ("Loss", "loss", [("train.loss", "-"), ("val.loss", "--")]),
    "accuracy": ("Validation accuracy", "%", [("val.top1", "-"), ("val.top5", "--")]),
    "lr": ("Learning rate", "lr", [("train.lr", "-")]),
    "throughput": ("Throughput", "img/s", [("train.total_ips", "-"), ("val.total_ips", "--")]),
}
# Charts with a log y axis: the first epoch's val loss can be far above the rest (83 on the demo, whose later
# losses are below 2), which on a linear axis flattens every later point onto the bottom line.
LOG_SCALE = {"loss"}


def load_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "report.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no report.json (is it a run dir of train.py?)")
    return list(json.loads(path.read_text()).get("epochs", []))


def lr_points(run_dir: Path, rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(epoch, LR) of a run, sorted, epochs from 0 as fractions: each epoch's end from report.json's rows (`rows`),
    and in between every step that RUN_DIR/csv/metrics.csv holds an LR for. training/module.py logs the LR there on
    Lightning's logging steps (trainer.log_every_n_steps: 50 by default, 10 in the demo), a host float read after
    the step's scheduler update, so the chart costs the training step nothing. A step is placed in its epoch by the
    report's step counts: step S (counted from 0, as the CSV's step column) of an epoch from step A to step B is at
    epoch + (S + 1 - A) / (B - A), where the report's end of that epoch (B) lies at epoch + 1. A run without the CSV
    (logger=none) has its epoch ends only."""
    ends = {int(r["epoch"]): int(r["step"]) for r in rows if r.get("step") is not None}
    points = {float(r["epoch"]) + 1: float(r["train.lr"]) for r in rows if r.get("train.lr") is not None}
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return sorted(points.items())
    try:
        with path.open(newline="") as file:
            logged = [(int(r["epoch"]), int(r["step"]), float(r["train.lr"])) for r in csv.DictReader(file)
                      if r.get("train.lr") and r.get("epoch") and r.get("step")]  # fmt: skip
    except (OSError, ValueError, csv.Error):  # a log cut short or edited: the report's epoch ends still chart the run
        return sorted(points.items())
    length = 0
    for epoch, step, lr in logged:  # a resumed run's re-logged steps come later in the file and win
        start = ends.get(epoch - 1, 0)
        length = ends[epoch] - start if epoch in ends else length  # an epoch in progress: as long as the last one
        if length > 0 and 0 <= step + 1 - start <= length:
            points[epoch + (step + 1 - start) / length] = lr
    return sorted(points.items())


def run_labels(run_dirs: list[Path]) -> list[str]:
    """The dir names, or longer paths where names repeat (sweep jobs 0, 1 of two sweeps)."""
    names = [p.name for p in run_dirs]
    if len(set(names)) == len(names):
        return names
    return [str(p) for p in run_dirs]


def check_replaceable(out_dir: Path) -> None:
    """The chart names are ours, not the user's: a file of that name in OUT_DIR (./plots by default for
    several runs) is replaced only if this module wrote it, as its PNG "Software" text says."""
    if os.path.lexists(out_dir) and not out_dir.is_dir():
        raise DataError(f"--out {out_dir} is a file, not a folder; choose another --out")
    for name in CHARTS:
        path = out_dir / f"{name}.png"
        if not os.path.lexists(path):
            continue
        try:
            with Image.open(path) as image:
                ours = getattr(image, "text", {}).get("Software") == SOFTWARE
        except OSError:
            ours = False
        if not ours:
            raise DataError(f"--out {out_dir}: {path.name} there was not written by imgcls.plot; choose another --out")


def draw_chart(
    name: str, runs: list[tuple[str, list[dict[str, Any]]]], lr: list[list[tuple[float, float]]] | None = None
) -> Figure:
    """The figure of chart NAME (a key of CHARTS) for (label, report rows) of each run; the caller closes it. `lr`:
    each run's lr_points, drawn on the lr chart instead of the rows' epoch ends."""
    title, ylabel, series = CHARTS[name]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    values: list[float] = []
    for i, (label, rows) in enumerate(runs):
        for key, style in series:
            if name == "lr" and lr is not None:
                points = lr[i]  # epochs from 0, fractions between an epoch's steps; its end at epoch + 1
            else:
                points = [(r["epoch"] + 1, r[key]) for r in rows if r.get(key) is not None]  # epochs from 1
            if points:
                xs, ys = zip(*points)
                values.extend(ys)
                marker = "o" if len(points) <= len(rows) else None  # a dot an epoch; a line through many steps
                ax.plot(xs, ys, style, marker=marker, markersize=3, color=colours[i % len(colours)],
                        label=f"{label} {key}" if len(runs) > 1 else key)  # fmt: skip
    if name in LOG_SCALE and values and min(values) > 0:  # a log axis cannot place 0 or a negative value
        ax.set_yscale("log")
        ylabel = f"{ylabel} (log scale)"
    if name == "lr":
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.set(title=title, xlabel="epoch", ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers, even for 2 of them
    ax.grid(alpha=0.3)
    if ax.get_yscale() == "log":
        ax.grid(alpha=0.1, which="minor", axis="y")  # the 2..9 lines of each decade
    if ax.has_data():
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_runs(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    runs = [(label, load_rows(p)) for label, p in zip(run_labels(run_dirs), run_dirs)]
    lr = [lr_points(p, rows) for p, (_, rows) in zip(run_dirs, runs)]
    check_replaceable(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in CHARTS:
        fig = draw_chart(name, runs, lr)
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=100, metadata={"Software": SOFTWARE})
        plt.close(fig)
        written.append(path)
    return written
