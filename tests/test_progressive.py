"""Progressive resizing: the FFCV ramp and TF2 stage schedules, per-epoch loaders of both backends,
and a real Lightning run (with a resume) whose batch shape changes at the scheduled epochs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from imgcls.config.checks import check_config
from imgcls.data.augment import with_magnitude
from imgcls.data.datamodule import ClassificationDataModule
from imgcls.data.progressive import ProgressiveSchedule, schedule_from_config
from imgcls.errors import ConfigError
from tests.conftest import compose_config, make_image_folder, tiny_overrides


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("prog"), classes=2, train_per_class=4, val_per_class=3)


def test_ffcv_ramp() -> None:
    # ffcv-imagenet rn50 88 epochs: min_res 160, max_res 192, start_ramp 65, end_ramp 76.
    ramp = ProgressiveSchedule(start_size=160, end_size=192, total_epochs=88, start_epoch=65, end_epoch=76)
    # get_resolution: np.interp then round(res / 32) * 32; 160 + 32 * 5/11 = 174.5 -> 160, 7/11 -> 192.
    expected = {0: 160, 65: 160, 70: 160, 71: 192, 75: 192, 76: 192, 87: 192}
    assert {e: ramp.size(e) for e in expected} == expected
    assert ramp.final_size == 192


def test_tf2_stages_and_augment_ramp() -> None:
    # TF2 v2-S: --n_stages 4 --base_img_size 128 --train_img_size 300 --max_epochs 350 --base_randaug_mag 5 (to 15).
    stages = ProgressiveSchedule(128, 300, total_epochs=350, stages=4, start_magnitude=5, end_magnitude=15)
    # epochs_per_stage = 350 // 4 = 87; size = int(128 + 172 * (stage + 1) / 4); mag = linspace(5, 15, 4).
    assert [stages.size(e) for e in (0, 86, 87, 174, 261, 349)] == [171, 171, 214, 257, 300, 300]
    assert [stages.magnitude(e) for e in (0, 87, 174, 349)] == [5, 8, 12, 15]
    assert stages.final_size == 300


@pytest.mark.slow
def test_config_errors_and_policy_strings(folder: Path) -> None:
    assert schedule_from_config(compose_config(tiny_overrides(folder)).data) is None
    for extra, message in [
        (["data.progressive.start_size=64"], "start_size=64 must be a positive size no larger than end_size=32"),
        (["data.progressive.start_size=16", "data.progressive.stages=5"], "stages=5 must be between 1 and the epochs"),
        (["data.progressive.start_size=16", "data.progressive.start_magnitude=2"], "data.augment=null"),
        (
            ["data.progressive.start_size=16", "data.progressive.start_epoch=1", "data.progressive.end_epoch=1"],
            "end_epoch=1 must be after start_epoch",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):  # up front; schedule_from_config trusts the config
            check_config(compose_config(tiny_overrides(folder, "data.progressive.enabled=true", *extra)))
    assert with_magnitude("rand-m9-mstd0.5", 5) == "rand-m5-mstd0.5"
    assert with_magnitude("rand-n2-m9", 3) == "rand-m3-n2"


@pytest.mark.parametrize("backend,resize", [("torchvision", "auto"), ("dali_cpu", "dali"), ("dali_cpu", "torch")])
def test_loader_size_follows_the_epoch(folder: Path, backend: str, resize: str) -> None:
    if backend.startswith("dali"):
        pytest.importorskip("nvidia.dali")
    overrides = tiny_overrides(
        folder, f"data.backend={backend}", f"data.dali_train_resize={resize}", "recipe.epochs=3",
        "model.image_size=48", "data.progressive.enabled=true",
        "data.progressive.start_size=16", "data.progressive.multiple_of=16", "data.progressive.end_epoch=2",
    )  # fmt: skip
    cfg = compose_config(overrides)
    datamodule = ClassificationDataModule(cfg.data, batch_size=4)
    trainer = SimpleNamespace(
        current_epoch=0, global_rank=0, world_size=1, reload_dataloaders_every_n_epochs=0, limit_train_batches=1.0
    )
    datamodule.trainer = trainer
    datamodule.setup("fit")
    assert trainer.reload_dataloaders_every_n_epochs == 1  # Lightning asks for a loader every epoch
    sizes, loaders, orders = [], [], []
    for epoch in range(3):
        trainer.current_epoch = epoch
        loader = datamodule.train_dataloader()
        loaders.append(loader)
        images, labels = next(iter(loader))
        sizes.append(images.shape[-1])
        orders.append(labels.tolist())
        assert loader is datamodule.train_dataloader()  # same size: the same loader, not rebuilt
    assert sizes == [16, 32, 48]
    if backend.startswith("dali"):  # (torchvision's sampler takes the epoch from Lightning's set_epoch)
        # Each stage's new loader starts a fresh order: a DALI pipeline built for a later stage was seeded as the
        # first one, and read the first epoch's order (and augmentation draws) again at every stage.
        assert orders[0] != orders[1] != orders[2] != orders[0], orders
    val_loader = datamodule.val_dataloader()
    images, _ = next(iter(val_loader))
    assert images.shape[-2:] == (48, 48)  # val at the final size
    if backend.startswith("dali"):
        # A replaced DALI loader stops its pipeline when the next one is built, the rest at teardown: none is left
        # to DALI's own __del__ (which can deadlock holding the GIL; data/dali/loader.py).
        running = [loader._end.alive for loader in loaders]
        assert running == [False, False, True]
        datamodule.teardown("fit")
        assert not loaders[-1]._end.alive and not val_loader._end.alive


@pytest.mark.slow
def test_run_changes_size_at_epochs_and_resumes(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("nvidia.dali")
    import imgcls.run.train
    from imgcls.training.module import ClassificationModule

    seen: list[tuple[int, str, int]] = []
    train_step, val_step = ClassificationModule.training_step, ClassificationModule.validation_step

    def record_train(self, batch, batch_idx):  # noqa: ANN001, ANN202 - wraps the real step
        seen.append((self.current_epoch, "train", batch[0].shape[-1]))
        return train_step(self, batch, batch_idx)

    def record_val(self, batch, batch_idx):  # noqa: ANN001, ANN202
        seen.append((self.current_epoch, "val", batch[0].shape[-1]))
        return val_step(self, batch, batch_idx)

    monkeypatch.setattr(ClassificationModule, "training_step", record_train)
    monkeypatch.setattr(ClassificationModule, "validation_step", record_val)
    overrides = tiny_overrides(
        folder, "data.backend=dali_cpu", "recipe.epochs=3", "recipe.warmup_epochs=0", "model.image_size=48",
        "data.progressive.enabled=true", "data.progressive.start_size=16", "data.progressive.multiple_of=16",
        "data.progressive.end_epoch=2",
    )  # fmt: skip
    # Stop after 2 of the 3 epochs, then resume from last.ckpt for the third.
    imgcls.run.train.run(compose_config([*overrides, "trainer.max_epochs=2"], run_dir=tmp_path))
    first = sorted(set(seen))
    seen.clear()
    imgcls.run.train.run(compose_config([*overrides, "ckpt_path=last"], run_dir=tmp_path))
    resumed = sorted(set(seen))
    assert first == [(0, "train", 16), (0, "val", 48), (1, "train", 32), (1, "val", 48)]
    # The resumed run continues with epoch 2, at epoch 2's size.
    assert resumed == [(2, "train", 48), (2, "val", 48)]
