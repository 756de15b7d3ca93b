"""The `debug` config group: `debug=tiny` (the tests' own runs) and `debug=overfit` (can the model learn?)."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgcls.run.train import run
from tests.conftest import compose_config, read_report


def test_tiny_is_a_small_cpu_run_and_the_command_line_still_wins(image_folder: Path) -> None:
    cfg = compose_config(["debug=tiny", f"data.root={image_folder}", "precision=bf16"])
    assert (cfg.model.name, cfg.hardware.name, cfg.data.name) == ("resnet18", "cpu", "folder")
    assert (cfg.data.batch_size, cfg.recipe.epochs, cfg.model.image_size) == (8, 2, 32)
    assert cfg.precision.name == "bf16"  # a choice on the command line beats the debug config's


@pytest.mark.slow
def test_overfit_drives_the_loss_of_two_batches_down(image_folder: Path, tmp_path: Path) -> None:
    run(compose_config(["debug=overfit", f"data.root={image_folder}"], run_dir=tmp_path))
    losses = [row["train.loss"] for row in read_report(tmp_path)["epochs"]]
    assert len(losses) == 20 and losses[-1] < 0.25 * losses[0]
