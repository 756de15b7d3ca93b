"""lr.png shows the LR between epochs: with a point an epoch a warm-up of an epoch was one dot, invisible."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from imgcls.callbacks.charts import draw_chart, load_rows, lr_points
from imgcls.run.train import run
from tests.conftest import compose_config, tiny_overrides


@pytest.mark.slow
def test_the_warmup_is_drawn_step_by_step(tmp_path: Path, image_folder: Path) -> None:
    """A real run: 48 images in batches of 8 (6 optimizer steps an epoch), one epoch of warm-up, the LR logged at
    every step (trainer.log_every_n_steps=1; 50 by default, 10 in the demo)."""
    overrides = tiny_overrides(image_folder, "recipe.warmup_epochs=1", "trainer.log_every_n_steps=1")
    run(compose_config(overrides, run_dir=tmp_path))
    rows = load_rows(tmp_path)
    points = lr_points(tmp_path, rows)
    warmup = [(x, lr) for x, lr in points if x <= 1]
    assert len(warmup) == 6  # each step of the first epoch, its end included
    assert [x for x, _ in warmup] == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1])
    assert all(a < b for (_, a), (_, b) in zip(warmup, warmup[1:]))  # the ramp
    assert warmup[-1][1] == pytest.approx(rows[0]["train.lr"])  # the step ending the epoch is the report's epoch end
    after = [lr for x, lr in points if x > 1]
    assert len(after) == 6 and all(a > b for a, b in zip(after, after[1:]))  # then the cosine, step by step
    fig = draw_chart("lr", [("run", rows)], [points])  # what lr.png draws
    xs, ys = fig.axes[0].lines[0].get_data()
    plt.close(fig)
    assert list(xs) == [x for x, _ in points] and list(ys) == [lr for _, lr in points]
    assert (tmp_path / "plots" / "lr.png").is_file()  # the run drew it at its end


def test_a_run_without_the_csv_log_keeps_its_epoch_ends(tmp_path: Path) -> None:
    rows = [{"epoch": e, "step": 6 * (e + 1), "train.lr": 0.1 / (e + 1)} for e in range(3)]
    (tmp_path / "report.json").write_text(json.dumps({"epochs": rows}))
    assert lr_points(tmp_path, rows) == [(1.0, 0.1), (2.0, 0.05), (3.0, pytest.approx(0.1 / 3))]


def test_steps_a_resumed_run_logged_twice_are_drawn_once(tmp_path: Path) -> None:
    """metrics.csv after a resume: the steps past the checkpoint were logged, then logged again (the later wins)."""
    rows = [{"epoch": 0, "step": 4, "train.lr": 0.4}, {"epoch": 1, "step": 8, "train.lr": 0.2}]
    (tmp_path / "csv").mkdir()
    lines = ["epoch,step,train.loss,train.lr", "0,1,1.0,0.2", "0,3,1.0,0.4", "1,5,1.0,0.9", "1,5,1.0,0.3", "1,6,,"]
    (tmp_path / "csv" / "metrics.csv").write_text("\n".join(lines) + "\n")
    assert lr_points(tmp_path, rows) == [(0.5, 0.2), (1.0, 0.4), (1.5, 0.3), (2.0, 0.2)]


def test_a_damaged_csv_log_leaves_the_epoch_ends(tmp_path: Path) -> None:
    rows = [{"epoch": 0, "step": 4, "train.lr": 0.4}]
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text("epoch,step,train.lr\n0,1,0.2\n0,2,0.3e\n")  # cut mid-number
    assert lr_points(tmp_path, rows) == [(1.0, 0.4)]
