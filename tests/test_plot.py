"""`python -m imgcls.plot`: PNG charts from report.json, several runs overlaid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from imgcls.plot import CHARTS

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


def test_several_runs_are_overlaid(tmp_path: Path) -> None:
    a, b = fake_run(tmp_path / "a", 2.0), fake_run(tmp_path / "b", 3.0)
    result = plot(str(a), str(b), "--out", str(tmp_path / "cmp"))
    assert result.returncode == 0, result.stderr
    for name in CHARTS:
        png = tmp_path / "cmp" / f"{name}.png"
        assert Image.open(png).format == "PNG" and Image.open(png).size[0] >= 600
        assert has_colour(png, MATPLOTLIB_BLUE) and has_colour(png, MATPLOTLIB_ORANGE), name  # both runs drawn


def test_one_run_plots_into_its_dir(tmp_path: Path) -> None:
    a = fake_run(tmp_path / "a", 2.0)
    result = plot(str(a))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (a / "plots").iterdir()) == sorted(f"{n}.png" for n in CHARTS)
    assert not has_colour(a / "plots" / "loss.png", MATPLOTLIB_ORANGE)  # one run: one colour


def test_a_dir_without_report_is_one_line_error(tmp_path: Path) -> None:
    result = plot(str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"imgcls: error: {tmp_path} has no report.json (is it a run dir of train.py?)"
    ]
