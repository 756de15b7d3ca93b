"""`python -m imgcls.plot`: PNG charts from report.json, several runs overlaid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from imgcls.callbacks.charts import CHARTS, draw_chart

MATPLOTLIB_BLUE, MATPLOTLIB_ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # colours of runs 1 and 2


def fake_run(run_dir: Path, scale: float) -> Path:
    rows = [
        {"epoch": e, "step": 10 * (e + 1), "train.loss": scale / (e + 1), "val.loss": scale / (e + 1.5),
         "val.top1": 10.0 * e, "val.top5": 15.0 * e, "train.lr": 0.1 * (1 - e / 4),
         "train.total_ips": 900.0 + e, "val.total_ips": 2000.0}
        for e in range(4)
    ]  # fmt: skip
    rows[-1].pop("val.loss")  # an epoch without validation must not break the charts
    run_dir.mkdir(parents=True)
    (run_dir / "report.json").write_text(json.dumps({"epochs": rows, "run": {}}))
    return run_dir


def plot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "imgcls.plot", *args], capture_output=True, text=True, timeout=300)


def has_colour(png: Path, rgb: tuple[int, int, int]) -> bool:
    pixels = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3).astype(int)
    return bool((np.abs(pixels - rgb).sum(axis=1) < 30).any())


@pytest.mark.slow
def test_several_runs_are_overlaid(tmp_path: Path) -> None:
    a, b = fake_run(tmp_path / "a", 2.0), fake_run(tmp_path / "b", 3.0)
    result = plot(str(a), str(b), "--out", str(tmp_path / "cmp"))
    assert result.returncode == 0, result.stderr
    for name in CHARTS:
        png = tmp_path / "cmp" / f"{name}.png"
        assert Image.open(png).format == "PNG" and Image.open(png).size[0] >= 600
        assert has_colour(png, MATPLOTLIB_BLUE) and has_colour(png, MATPLOTLIB_ORANGE), name  # both runs drawn


@pytest.mark.slow
def test_one_run_plots_into_its_dir(tmp_path: Path) -> None:
    a = fake_run(tmp_path / "a", 2.0)
    result = plot(str(a))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (a / "plots").iterdir()) == sorted(f"{n}.png" for n in CHARTS)
    assert not has_colour(a / "plots" / "loss.png", MATPLOTLIB_ORANGE)  # one run: one colour


@pytest.mark.slow
def test_a_dir_without_report_is_one_line_error(tmp_path: Path) -> None:
    result = plot(str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"imgcls: error: {tmp_path} has no report.json (is it a run dir of train.py?)"
    ]


def test_loss_axis_shows_the_epochs_after_a_huge_first_val_loss() -> None:
    """The demo's first val loss (83) against later losses below 2: on the loss chart's log axis the later
    points spread over the chart; on a linear axis they would share its bottom 2 %."""
    losses = [(2.2, 83.0), (1.3, 1.9), (0.9, 1.1), (0.7, 0.8), (0.6, 0.7)]  # (train.loss, val.loss) per epoch
    rows = [{"epoch": e, "train.loss": t, "val.loss": v} for e, (t, v) in enumerate(losses)]
    fig = draw_chart("loss", [("demo", rows)])
    try:
        ax = fig.axes[0]
        assert ax.get_yscale() == "log"
        later = ax.transData.transform([(2, v) for pair in losses[1:] for v in pair])[:, 1]  # display pixels
        assert (later.max() - later.min()) / ax.bbox.height > 0.15
    finally:
        plt.close(fig)


def test_loss_axis_stays_linear_for_a_loss_a_log_axis_cannot_place() -> None:
    rows = [{"epoch": 0, "train.loss": 0.0}, {"epoch": 1, "train.loss": 1.0}]
    fig = draw_chart("loss", [("run", rows)])
    try:
        assert fig.axes[0].get_yscale() == "linear"
    finally:
        plt.close(fig)
