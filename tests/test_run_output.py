"""What a run tells its user: every log line once (console and train.log), no advertisement, no
warning caused by the EMA copy, one line per epoch whatever the progress bar, a closing summary whose commands
work, and the charts in the run dir."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from PIL import Image

from imgcls.plot import SOFTWARE
from tests.conftest import read_report, run_cli, tiny_overrides


@pytest.fixture(scope="module")
def finished(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("run")
    result = run_cli("train.py", *tiny_overrides(image_folder, "recipe.ema_decay=0.9"), f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, result.stdout + result.stderr


@pytest.mark.slow
def test_every_line_once_and_in_the_log_file(finished: tuple[Path, str]) -> None:
    run_dir, output = finished
    log_file = (run_dir / "train.log").read_text()
    for line in ("GPU available", "`Trainer.fit` stopped", "; plan {"):
        assert output.count(line) == 1, line
        assert log_file.count(line) == 1, line
    assert "litlogger" not in output and "Tip:" not in output
    assert "in eval mode at the start of training" not in output  # the EMA copy (recipe.ema_decay)


@pytest.mark.slow
def test_one_line_per_epoch_without_a_progress_bar(finished: tuple[Path, str]) -> None:
    run_dir, output = finished
    lines = [line for line in output.splitlines() if re.search(r"\] - epoch \d+/2 ", line)]
    assert len(lines) == 2
    rows = read_report(run_dir)["epochs"]
    for line, row in zip(lines, rows, strict=True):
        assert f"epoch {row['epoch'] + 1}/2" in line and f"train.loss {row['train.loss']:.4f}" in line
        assert f"val.top1 {row['val.top1']:.2f}" in line and f"val.top5 {row['val.top5']:.2f}" in line
        assert re.search(r" \d+ img/s  \d+:\d\d:\d\d  ETA \d+:\d\d:\d\d$", line)
    assert lines[-1].endswith("ETA 0:00:00")


@pytest.mark.slow
def test_closing_summary_names_the_best_epoch_and_the_charts(finished: tuple[Path, str]) -> None:
    run_dir, output = finished
    rows = read_report(run_dir)["epochs"]
    best = max(rows, key=lambda r: r["val.top1"])
    assert f"best val.top1 {best['val.top1']:.2f} at epoch {best['epoch'] + 1} of 2" in output
    assert f"evaluate: python evaluate.py ckpt={run_dir}/checkpoints/best.ckpt" in output
    for name in ("loss", "accuracy", "lr", "throughput"):
        with Image.open(run_dir / "plots" / f"{name}.png") as image:
            assert image.text.get("Software") == SOFTWARE


@pytest.mark.slow
def test_the_printed_commands_evaluate_and_resume_the_run(finished: tuple[Path, str]) -> None:
    run_dir, output = finished
    evaluate = shlex.split(output.split("evaluate: ", 1)[1].splitlines()[0])
    result = run_cli(*evaluate[1:], f"hydra.run.dir={run_dir / 'eval'}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (run_dir / "eval" / "eval.json").is_file()
    resume = shlex.split(output.split("resume:   ", 1)[1].splitlines()[0])
    assert resume[:2] == ["python", "train.py"] and resume[-1] == "ckpt_path=last"
    result = run_cli(*resume[1:])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Restoring states from the checkpoint path at" in result.stdout + result.stderr
    assert len(read_report(run_dir)["epochs"]) == 2  # the finished run is resumed, not started again
