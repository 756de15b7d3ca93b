"""A progress line every `callbacks.log_every_n_steps` optimizer steps (NVIDIA's print_freq), in every log: the
console without a terminal (a pipe here, as SLURM's log is) and the run's log file; read without a host sync on
any step; with a bar on a terminal, the console's lines printed through the bar and the loss shown in it."""

from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path

import lightning as L
import pytest

import imgcls.run.train
from imgcls.callbacks.console import BarLogRouting, progress_bar
from imgcls.callbacks.epoch_log import PROGRESS_LOGGER
from tests.conftest import compose_config, run_cli, tiny_overrides
from tests.test_host_sync import SyncCounter, count_syncs, syncing

LINE = re.compile(
    r"step (?P<step>\d+)/(?P<steps>\d+)  epoch (?P<epoch>\d+)/(?P<epochs>\d+)  loss (?P<loss>\S+)  lr (?P<lr>\S+)  "
    r"(?P<ips>\d+) img/s  data (?P<data>[\d.]+) ms  ETA (?P<eta>\d+:\d\d:\d\d)$"
)
STEPS_PER_EPOCH = 6  # the session's image_folder: 48 training images, batch 8


def progress_lines(text: str) -> list[dict[str, str]]:
    return [m.groupdict() for line in text.splitlines() if (m := LINE.search(line))]


def test_default_interval_is_nvidias_print_freq() -> None:
    cfg = compose_config(["debug=tiny", "data.root=/tmp"])
    assert cfg.callbacks.log_every_n_steps == 20  # NVIDIA ConvNets/configs.yml convergence print_freq


@pytest.mark.slow
def test_progress_lines_in_a_piped_console_and_the_run_log(image_folder: Path, tmp_path: Path) -> None:
    """Without a terminal (train.py's stdout is a file here) there was nothing between two epoch lines."""
    run_dir = tmp_path / "run"
    result = run_cli(
        "train.py",
        *tiny_overrides(image_folder, "callbacks.log_every_n_steps=2", "callbacks.progress_bar=rich"),
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = progress_lines(result.stdout)
    assert [int(line["step"]) for line in lines] == [2, 4, 6, 8, 10, 12], result.stdout[-3000:]
    for line in lines:
        assert int(line["steps"]) == 2 * STEPS_PER_EPOCH and line["epochs"] == "2"
        assert int(line["epoch"]) == 1 + (int(line["step"]) - 1) // STEPS_PER_EPOCH
        assert math.isfinite(float(line["loss"])) and float(line["loss"]) > 0
        assert float(line["lr"]) >= 0 and int(line["ips"]) >= 0 and float(line["data"]) >= 0
    assert float(lines[0]["lr"]) > 0  # in the warm-up: the LR the step trained with
    seconds = [sum(int(part) * 60**k for k, part in enumerate(reversed(line["eta"].split(":")))) for line in lines]
    assert seconds[-1] <= seconds[0]  # 10 steps and 2 validations to go, then 1 validation
    # An epoch's last line comes before its validation and epoch line.
    out = result.stdout
    assert out.index("step 6/12") < out.index("epoch 1/2  train.loss") < out.index("step 8/12")
    assert progress_lines((run_dir / "train.log").read_text()) == lines  # the run's log file has them too


@pytest.mark.slow
def test_progress_lines_add_no_host_sync_on_any_step(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each line's loss is read a micro-batch after its logging step (a DeferredRead, listed, not counted); a read
    on the logging step itself (`.item()` of the loss) is a sync the counter finds."""
    counter = SyncCounter()
    count_syncs(monkeypatch, counter)
    caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)
    overrides = tiny_overrides(image_folder, "callbacks.log_every_n_steps=2", "trainer.limit_val_batches=0")
    imgcls.run.train.run(compose_config(overrides, run_dir=tmp_path))
    assert counter.started == 2 * STEPS_PER_EPOCH
    assert not syncing(counter.calls, "train"), syncing(counter.calls, "train")
    # Steps 2, 4, 8, 10 end micro-batches 1, 3, 7, 9 and are read in the next; an epoch's last (6, 12) at its end.
    assert {(1, 2), (3, 4), (7, 8), (9, 10)} <= set(counter.deferred), counter.deferred
    logged = [r.getMessage() for r in caplog.records if r.name == PROGRESS_LOGGER]
    assert [int(m.split()[1].split("/")[0]) for m in logged] == [2, 4, 6, 8, 10, 12]


def _tty_handler() -> tuple[logging.StreamHandler, int, int]:
    """A console handler writing to a real terminal (a pseudo-terminal), as Hydra's is on one."""
    main, follower = os.openpty()
    stream = os.fdopen(follower, "w", buffering=1)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    return handler, main, follower


def test_a_bar_on_a_terminal_prints_the_console_lines_through_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hydra's console handler wrote straight to the terminal, into the bar's line; with the bar drawn, each line
    goes through the bar's own printing (above it), the progress lines stay off the console (the bar shows their
    loss), and the log file's handler is left alone."""
    handler, main, follower = _tty_handler()
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(root, "level", logging.INFO)
    printed: list[str] = []
    routing = BarLogRouting()
    routing.start(lambda stream: printed.append)
    try:
        logging.getLogger("imgcls").info("epoch 1/2  train.loss 1.0")
        logging.getLogger(PROGRESS_LOGGER).info("step 2/12  loss 1.0")
    finally:
        routing.stop()
    assert printed == ["imgcls: epoch 1/2  train.loss 1.0\n"]
    logging.getLogger("imgcls").info("after the bar")
    handler.flush()
    assert os.read(main, 1000).decode().replace("\r", "") == "imgcls: after the bar\n"  # the terminal's again
    handler.stream.close()
    os.close(main)


def test_the_bar_shows_the_progress_lines_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's bar showed no loss (imgcls logs none as a progress-bar metric: Lightning reads those on the host
    every batch); it shows the latest progress line's."""
    monkeypatch.setattr("imgcls.callbacks.console.on_a_terminal", lambda kind: True)
    trainer = L.Trainer(logger=False, accelerator="cpu", devices=1, enable_checkpointing=False)
    for kind in ("rich", "tqdm"):
        bar = progress_bar(kind, 5, loss_of=lambda: 2.34567)
        assert bar is not None and bar.get_metrics(trainer, None) == {"loss": "2.3457"}, kind  # type: ignore[arg-type]
        assert progress_bar(kind, 5).get_metrics(trainer, None) == {}  # type: ignore[arg-type,union-attr]
