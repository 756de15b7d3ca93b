"""NVIDIA main.py options with an imgcls equivalent that needed code (docs/nvidia-options.md has the table)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from imgcls.run.train import run
from tests.conftest import compose_config, read_report, tiny_overrides


@pytest.mark.slow
def test_keep_epochs_keeps_the_newest_n_epoch_checkpoints(image_folder: Path, tmp_path: Path) -> None:
    """--gather-checkpoints N: a checkpoint per epoch, the newest N kept (NVIDIA's N=0 bug not copied)."""
    run(compose_config(tiny_overrides(image_folder, "recipe.epochs=3", "callbacks.checkpoint.keep_epochs=2"),
                       run_dir=tmp_path))  # fmt: skip
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("epoch_*.ckpt"))
    assert kept == ["epoch_0001.ckpt", "epoch_0002.ckpt"]
    assert torch.load(tmp_path / "checkpoints" / kept[-1], weights_only=True)["epoch"] == 2
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_keep_all_epoch_checkpoints(image_folder: Path, tmp_path: Path) -> None:
    run(compose_config(tiny_overrides(image_folder, "recipe.epochs=3", "callbacks.checkpoint.keep_epochs=-1"),
                       run_dir=tmp_path))  # fmt: skip
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("epoch_*.ckpt"))
    assert kept == ["epoch_0000.ckpt", "epoch_0001.ckpt", "epoch_0002.ckpt"]


@pytest.mark.slow
def test_early_stopping_stops_at_the_first_epoch_without_a_better_top1(image_folder: Path, tmp_path: Path) -> None:
    """--early-stopping-patience 1: the run ends after the first epoch whose val.top1 is not above the best."""
    overrides = tiny_overrides(image_folder, "recipe.epochs=6", "callbacks.early_stopping_patience=1")
    run(compose_config(overrides, run_dir=tmp_path))
    top1 = [row["val.top1"] for row in read_report(tmp_path)["epochs"]]
    best, expected = float("-inf"), len(top1)
    for epoch, value in enumerate(top1):
        if value <= best:
            expected = epoch + 1
            break
        best = value
    assert len(top1) == expected < 6  # this data and seed stop early (at epoch 3)


@pytest.mark.slow
def test_training_only_has_no_best_checkpoint_and_no_val_metrics(image_folder: Path, tmp_path: Path, recwarn) -> None:
    """--training-only = trainer.limit_val_batches=0: last.ckpt every epoch, no best.ckpt (nothing to rank)."""
    summary = run(compose_config(tiny_overrides(image_folder, "trainer.limit_val_batches=0"), run_dir=tmp_path))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt"]
    assert "val.top1" not in summary and summary["train.loss"] > 0
    assert not [w for w in recwarn if "could not find the monitored key" in str(w.message)]
