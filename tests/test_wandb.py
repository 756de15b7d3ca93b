"""logger=wandb in offline mode, read back from what wandb wrote: metrics under NVIDIA's names, LR,
throughput, the resolved config, a grid of augmented training images, per-class val accuracy and a
confusion matrix; a resumed run continues the same W&B run id."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.models.resnet import ResNet

from imgcls.run.train import run
from tests.conftest import compose_config, read_report, tiny_overrides


def offline_runs(run_dir: Path) -> list[Path]:
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    return sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))


def wandb_log(offline: Path, *expected: bytes) -> bytes:
    """The run's log once it holds every `expected` record: wandb-core flushes it in the background after finish(),
    in no fixed order, so a test waits for each record it checks (the 60 s bound only catches a hang)."""
    log_file = next(offline.glob("run-*.wandb"))
    deadline = time.monotonic() + 60
    while not all(key in log_file.read_bytes() for key in expected) and time.monotonic() < deadline:
        time.sleep(0.5)
    return log_file.read_bytes()


EVAL_FORWARDS: list[int] = []  # network forward calls outside autograd (validation), per invocation


@pytest.fixture(scope="module")
def wandb_run(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Epoch 0 of 2, then a resume of the same run dir for epoch 1; with EMA."""
    mp = pytest.MonkeyPatch()
    mp.setenv("WANDB_MODE", "offline")
    forward = ResNet.forward

    def counting_forward(self: ResNet, x: torch.Tensor) -> torch.Tensor:
        EVAL_FORWARDS[-1] += not torch.is_grad_enabled()
        return forward(self, x)

    mp.setattr(ResNet, "forward", counting_forward)
    run_dir = tmp_path_factory.mktemp("wandb")
    args = tiny_overrides(
        image_folder, "logger=wandb", "logger.wandb.log_images=8", "trainer.log_every_n_steps=1",
        "recipe.ema_decay=0.9",
    )  # fmt: skip
    for extra in ("trainer.max_epochs=1", "ckpt_path=last"):
        if extra == "ckpt_path=last":
            # wandb names an offline run's folder by its start time in whole seconds: a first run shorter than a
            # second (a fast machine) and its resume shared one folder (CI, once). A new second, on any machine.
            time.sleep(1.1)
        EVAL_FORWARDS.append(0)
        run(compose_config([*args, extra], run_dir=run_dir))
    mp.undo()
    return run_dir


@pytest.mark.slow
def test_media_take_predictions_from_the_validation_pass(wandb_run: Path) -> None:
    """One forward of the network and one of its EMA copy per val batch (18 images / 8 = 3 batches, one
    validation per invocation): the per-class table adds no second pass over the val set."""
    assert EVAL_FORWARDS == [3 * 2, 3 * 2]


@pytest.mark.slow
def test_dashboard_scalars_and_config(wandb_run: Path) -> None:
    keys = (b"train.loss", b"val.top1", b"val.top5", b"train.lr", b"train.total_ips", b"val.total_ips")
    log = wandb_log(offline_runs(wandb_run)[0], b"val.confusion_matrix", *keys, b"run_config")
    for key in keys:
        assert key in log, key
    assert b"run_config" in log and b"resnet18" in log and b"lr_per_256" in log  # the resolved config


@pytest.mark.slow
def test_sample_grid_of_augmented_training_images(wandb_run: Path) -> None:
    """The grid shows the images: each tile is its class's colour (image_folder: class k is channel k at 200-255,
    the others 0-55, before augmentation), in the order of the caption's labels. A float grid in [0, 1] was
    stored as is, a black PNG (pixel values 0 and 1)."""
    offline = offline_runs(wandb_run)[0]
    (png,) = (offline / "files" / "media" / "images").glob("train.samples_*.png")
    grid = np.asarray(Image.open(png).convert("RGB"), dtype=np.float64)
    # 8 images of 32 px in one row, make_grid's 2 px padding around each.
    assert grid.shape == (34 + 2, 8 * 34 + 2, 3)
    caption = re.search(rb'\["(class_\d(?: class_\d)*)"\]', wandb_log(offline, b"captions"))
    assert caption is not None
    labels = [int(name.rsplit("_", 1)[1]) for name in caption.group(1).decode().split()]
    assert len(labels) == 8
    for i, label in enumerate(labels):
        means = grid[2:34, 2 + 34 * i : 34 + 34 * i].mean(axis=(0, 1))  # the tile, without its padding
        assert means[label % 3] > 170, (i, label, means)
        assert all(means[c] < 80 for c in range(3) if c != label % 3), (i, label, means)


@pytest.mark.slow
def test_per_class_accuracy_matches_val_top1(wandb_run: Path) -> None:
    """The table from the run's final validation, one per W&B run (each invocation ends with one)."""
    report = read_report(wandb_run)["epochs"]
    for offline, row in zip(offline_runs(wandb_run), report):
        (table_file,) = (offline / "files" / "media" / "table").glob("val.per_class_*.table.json")
        table = json.loads(table_file.read_text())
        assert table["columns"] == ["class", "val.top1", "images"]
        assert [r[0] for r in table["data"]] == ["class_0", "class_1", "class_2"]
        total = sum(r[2] for r in table["data"])
        assert total == 18  # every val image once
        assert sum(r[1] * r[2] for r in table["data"]) / total == pytest.approx(row["val.top1"], abs=1e-4)
        assert b"val.confusion_matrix" in wandb_log(offline, b"val.confusion_matrix")


@pytest.mark.slow
def test_resume_continues_the_same_wandb_run(wandb_run: Path) -> None:
    first, second = offline_runs(wandb_run)  # both named ...-<the id in wandb_id.txt>
    assert first.name.rsplit("-", 1)[1] == second.name.rsplit("-", 1)[1]
    assert [r["epoch"] for r in read_report(wandb_run)["epochs"]] == [0, 1]
    assert b"val.top1" in wandb_log(second, b"val.top1")


@pytest.mark.slow
def test_wandb_online_without_credentials_is_one_line_and_warns_nothing_else(
    tmp_path: Path, image_folder: Path
) -> None:
    """A new user's `logger=wandb` without `wandb login`: wandb.init raised UsageError from inside Lightning's fit, a
    traceback; now one line with W&B's reason and the offline way. W&B's 'anonymous setting has no effect' warning
    (Lightning hands it anonymous=None) is gone too. No network is touched: W&B stops before it without a key."""
    from tests import warm_python
    from tests.conftest import ROOT, assert_one_line_error, clean_env

    env = {k: v for k, v in clean_env().items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path / "home")  # no ~/.netrc, no W&B settings of this machine's user
    env["WANDB_BASE_URL"] = "http://127.0.0.1:9"  # were W&B to try the network, a closed local port
    argv = [ROOT / "train.py", *tiny_overrides(image_folder, "logger=wandb"), f"hydra.run.dir={tmp_path / 'run'}"]
    result = warm_python.run(argv, base_env=env, cwd=tmp_path, timeout=300)
    assert_one_line_error(result, "logger=wandb: No API key configured", "logger.wandb.offline=true")
    assert "anonymous" not in result.stderr
