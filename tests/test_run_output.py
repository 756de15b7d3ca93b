"""What a run tells its user: every log line once (console and train.log), no advertisement, no
warning caused by the EMA copy, one line per epoch whatever the progress bar, a closing summary whose commands
work, and the charts in the run dir."""

from __future__ import annotations

import csv
import re
import shlex
from pathlib import Path

import pytest
from PIL import Image

from imgcls.callbacks.charts import SOFTWARE
from tests import warm_python
from tests.conftest import compose_config, read_report, run_cli, tiny_overrides


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
def test_closing_summary_names_the_best_epoch_and_the_charts(finished: tuple[Path, str], image_folder: Path) -> None:
    run_dir, output = finished
    rows = read_report(run_dir)["epochs"]
    best = max(rows, key=lambda r: r["val.top1"])
    assert f"best val.top1 {best['val.top1']:.2f} at epoch {best['epoch'] + 1} of 2" in output
    # the data too: a checkpoint names none (docs/reliability.md "What imgcls trusts")
    assert f"evaluate: python evaluate.py ckpt={run_dir}/checkpoints/best.ckpt data.root={image_folder}\n" in output
    for name in ("loss", "accuracy", "lr", "throughput"):
        with Image.open(run_dir / "plots" / f"{name}.png") as image:
            assert image.text.get("Software") == SOFTWARE


@pytest.mark.slow
def test_summary_csv_has_a_row_per_epoch_and_the_report_the_best_epoch_wall_time_and_command(
    finished: tuple[Path, str],
) -> None:
    """summary.csv: one row per epoch (counted from 1, as the epoch lines count) with the report's numbers; report.json:
    the best epoch (numbered as its rows), the run's wall time and the command. Lightning's csv/metrics.csv has a
    row per logging call instead, mostly empty cells."""
    run_dir, _ = finished
    report = read_report(run_dir)
    rows = report["epochs"]
    with (run_dir / "summary.csv").open(newline="") as file:
        table = list(csv.DictReader(file))
    assert [(int(line["epoch"]), int(line["step"])) for line in table] == [(1, 6), (2, 12)]
    columns = ("train.loss", "val.loss", "val.top1", "val.top5", "val_ema.top1", "train.lr", "train.total_ips")
    for line, row in zip(table, rows, strict=True):
        for key in (*columns, "wall_time_s"):
            assert float(line[key]) == pytest.approx(row[key]), key
    assert 0 < rows[0]["wall_time_s"] <= rows[1]["wall_time_s"] <= report["wall_time_s"]
    best = max(rows, key=lambda r: r["val.top1"])
    assert report["best"] == {"epoch": best["epoch"], "step": best["step"], "val.top1": best["val.top1"]}
    command = shlex.split(report["command"])
    assert command[:3] == ["python", "train.py", "debug=tiny"] and "recipe.ema_decay=0.9" in command


@pytest.mark.slow
def test_the_wall_time_continues_over_a_resume(image_folder: Path, tmp_path: Path) -> None:
    """A run stopped after epoch 1 and resumed: its wall time goes on from the checkpoint's (here set to 10^6 s, as
    if the first invocation had run for days), it does not start again at 0."""
    import torch

    from imgcls.run.train import run

    args = tiny_overrides(image_folder)
    run(compose_config([*args, "trainer.max_epochs=1"], run_dir=tmp_path))
    last = tmp_path / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=False)
    assert 0 < checkpoint["callbacks"]["ReportCallback"]["wall_time_s"] < 600
    checkpoint["callbacks"]["ReportCallback"]["wall_time_s"] = 1e6
    torch.save(checkpoint, last)
    run(compose_config([*args, "ckpt_path=last"], run_dir=tmp_path))
    report = read_report(tmp_path)
    first, second = report["epochs"]
    assert first["wall_time_s"] < 600 and 1e6 < second["wall_time_s"] <= report["wall_time_s"] < 1e6 + 600
    assert report["command"] is None  # imgcls.run.train.run called from Python: no command line


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


def demo_overrides(run_dir: Path, *extra: str) -> list[str]:
    """`make train` (experiment=demo) scaled down to seconds: 3 batches of 64 digits an epoch, 2 epochs, timm's
    test_resnet; its progress bar (rich) and model summary as a user gets them."""
    return [
        "experiment=demo", "recipe.epochs=2", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
        "model.arch=test_resnet", "data.num_workers=0", f"hydra.run.dir={run_dir}", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {"IMGCLS_CACHE": str(tmp_path_factory.mktemp("cache"))}  # the demo's digits, written by its first run


def on_a_terminal(*argv: str, env: dict[str, str]) -> str:
    """What `python ARGV` shows on a terminal (a pseudo-terminal of 120 x 40), with the redraws as new lines."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import termios

    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    shim, shim_environment = warm_python.shim()  # a warm process; its stdout and stderr are the shim's: the terminal
    environment = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR")}
    environment.update(env, **shim_environment, TERM="xterm", WANDB_MODE="offline")
    with subprocess.Popen([shim, *argv], stdin=terminal, stdout=terminal, stderr=terminal, env=environment) as proc:
        os.close(terminal)
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every end of the terminal is closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=600) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    os.close(controller)
    text = b"".join(chunks).decode(errors="replace").replace("\r", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)  # without the terminal's control sequences


@pytest.mark.slow
def test_a_log_without_a_terminal_has_the_epoch_lines_and_no_noise(demo_cache: dict[str, str], tmp_path: Path) -> None:
    """A SLURM log or a pipe: no progress bar (rich left each epoch's last frame with `v_num: csv` and a stray
    `val.top1: ...` line), no third-party warning (torch's LeafSpec deprecation in Lightning, Lightning's
    log_every_n_steps advice), a model summary in the log file without `Total FLOPs: 0`."""
    result = run_cli("train.py", *demo_overrides(tmp_path / "run"), env=demo_cache)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert [line.split(" - ", 1)[1][:9] for line in output.splitlines() if "] - epoch " in line] == [
        "epoch 1/2",
        "epoch 2/2",
    ]
    assert "Epoch " not in output and "v_num" not in output
    assert not re.search(r"^\s*val\.top1: ", output, re.MULTILINE)
    assert not re.search(r"\.py:\d+: ", output), output  # a warning's `FILE:LINE: message`
    assert "Skipping setting a default" not in output  # Lightning on our summary callback
    log_file = (tmp_path / "run" / "demo.log").read_text()
    assert "Total params" in log_file and "Trainable params" in log_file
    assert "FLOPs" not in output + log_file and "Flops" not in output + log_file


@pytest.mark.slow
@pytest.mark.parametrize("bar", ["rich", "tqdm"])
def test_the_progress_bar_counts_epochs_as_the_epoch_lines(
    bar: str, demo_cache: dict[str, str], tmp_path: Path
) -> None:
    """On a terminal: `Epoch 1/2` then `Epoch 2/2` on the bar, next to `epoch 1/2` and `epoch 2/2` in the log
    (Lightning's bar said `Epoch 0/1` and `Epoch 1/1`), and no `v_num`."""
    from tests.conftest import ROOT

    output = on_a_terminal(
        str(ROOT / "train.py"), *demo_overrides(tmp_path / "run", f"callbacks.progress_bar={bar}"), env=demo_cache
    )
    bar_lines = {line.split("━")[0].split(":")[0].strip() for line in output.splitlines() if line.startswith("Epoch")}
    assert bar_lines == {"Epoch 1/2", "Epoch 2/2"}, output[-3000:]
    assert "epoch 1/2  train.loss" in output and "epoch 2/2  train.loss" in output
    assert "v_num" not in output
