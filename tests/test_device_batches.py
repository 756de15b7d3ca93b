"""The torchvision backend ships uint8 batches and normalizes them on the training device (issue 30 item 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

import imgcls.run.train
from imgcls.data.backends import make_backend
from imgcls.data.datamodule import ClassificationDataModule
from imgcls.data.device_prefetch import copier_for, one_batch_ahead
from imgcls.data.images import CheckedImageFolder
from imgcls.data.protocol import LoaderSpec
from imgcls.data.transforms import train_transform, val_transform
from imgcls.seeding import seeded
from tests.conftest import compose_config, tiny_overrides


def _data(image_folder: Path, *extra: str) -> Any:
    return compose_config(tiny_overrides(image_folder, "data.num_workers=0", *extra)).data


@pytest.mark.parametrize("split", ["train", "val"])
def test_uint8_batches_normalized_on_the_device_equal_worker_normalized_ones(image_folder: Path, split: str) -> None:
    """Today's images (ToTensor + Normalize in the workers) and the uint8 path (the same crop as uint8, then
    DeviceNormalize) agree to float rounding, for the augmented train transform (seeded alike) and val."""
    data = _data(image_folder, "data.augment=randaugment")
    datamodule = ClassificationDataModule(data, batch_size=8)
    make = train_transform if split == "train" else val_transform
    folder = str(image_folder / split)
    floats = CheckedImageFolder(folder, make(data, None, normalize=True))
    uint8 = CheckedImageFolder(folder, make(data, None, normalize=False))
    for index in range(0, len(floats), 5):
        with seeded(index):
            expected, label = floats[index]
        with seeded(index):
            raw, same_label = uint8[index]
        assert raw.dtype == torch.uint8 and label == same_label
        got = datamodule.on_after_batch_transfer((raw.unsqueeze(0), torch.tensor([label])), 0)[0][0]
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)  # float rounding: a few ulps of |x| < 3


def test_the_loader_ships_a_quarter_of_float32s_bytes(image_folder: Path) -> None:
    data = _data(image_folder)
    backend = make_backend(data)
    for split in ("train", "val"):
        images, labels = next(iter(backend.loader(LoaderSpec(split, 4))))
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert images.element_size() * images.nelement() == 4 * 3 * 32 * 32  # debug=tiny: 32 px, a byte each


class BatchSeen(L.Callback):
    def __init__(self) -> None:
        self.train: list[tuple[torch.dtype, bool]] = []
        self.val: list[tuple[torch.dtype, bool]] = []

    @staticmethod
    def _what(batch: Any) -> tuple[torch.dtype, bool]:
        images = batch[0]
        return images.dtype, images.is_contiguous(memory_format=torch.channels_last)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        self.train.append(self._what(batch))

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int,
                                  dataloader_idx: int = 0) -> None:  # fmt: skip
        self.val.append(self._what(batch))


@pytest.mark.slow
@pytest.mark.parametrize("channels_last", [False, True])
def test_a_run_trains_and_validates_on_normalized_float_batches(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, channels_last: bool
) -> None:
    """Lightning calls the DataModule's on_after_batch_transfer for both splits: the network never sees uint8."""
    seen = BatchSeen()
    real_build = imgcls.run.train.build_trainer
    monkeypatch.setattr(imgcls.run.train, "build_trainer", lambda cfg, plan, callbacks, loggers: real_build(
        cfg, plan, [seen, *callbacks], loggers))  # fmt: skip
    overrides = tiny_overrides(image_folder, "recipe.epochs=1", f"model.channels_last={str(channels_last).lower()}")
    imgcls.run.train.run(compose_config(overrides, run_dir=tmp_path))
    assert seen.train and seen.val
    assert set(seen.train) == set(seen.val) == {(torch.float32, channels_last)}


def test_synthetic_data_is_one_batch_made_on_the_device_once_per_split() -> None:
    """NVIDIA's synthetic loader: no per-sample drawing, no copy per step (issue 30 item 2)."""
    data = compose_config(["data=synthetic", "data.num_classes=10", "data.train_samples=40", "data.val_samples=20",
                           "model.image_size=16", "model.channels_last=true"]).data  # fmt: skip
    datamodule = ClassificationDataModule(data, batch_size=8)
    train, val = datamodule.train_dataloader(), datamodule.val_dataloader()
    assert (len(train), len(val)) == (5, 3)  # train drops the last partial batch; val keeps it
    batches = list(train)
    assert len(batches) == 5 and all(images is batches[0][0] and labels is batches[0][1] for images, labels in batches)
    images, labels = batches[0]
    assert images.dtype == torch.float32 and images.shape == (8, 3, 16, 16)
    assert images.is_contiguous(memory_format=torch.channels_last) and images.device.type == "cpu"
    assert labels.dtype == torch.int64 and 0 <= int(labels.min()) and int(labels.max()) < 10
    assert not torch.equal(next(iter(val))[0], images)  # a batch of its own for validation
    assert datamodule.on_after_batch_transfer(batches[0], 0)[0] is images  # already normalized: passed through


def test_synthetic_train_loader_resumes_with_the_steps_its_epoch_had_left() -> None:
    data = compose_config(["data=synthetic", "data.num_classes=4", "data.train_samples=48", "model.image_size=8"]).data
    first = ClassificationDataModule(data, batch_size=8).train_dataloader()
    taken = iter(first)
    for _ in range(4):
        next(taken)
    state = first.state_dict()
    resumed = ClassificationDataModule(data, batch_size=8).train_dataloader()
    resumed.load_state_dict(state)
    assert len(list(resumed)) == 2 and len(list(resumed)) == 6  # the rest of the epoch, then whole epochs
    at_end = ClassificationDataModule(data, batch_size=8).train_dataloader()
    at_end.load_state_dict({"consumed_steps": 6})
    assert len(list(at_end)) == 6


class RecordingCopier:
    """A CPU stand-in for data/device_prefetch.CudaCopies: records the order of copies and hand-overs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self._staged = 0

    def stage(self, batch: Any) -> tuple[Any, int]:
        self._staged += 1
        self.events.append(("stage", self._staged))
        return batch, self._staged

    def hand_over(self, staged: tuple[Any, int]) -> Any:
        self.events.append(("hand over", staged[1]))
        return staged[0]


def test_each_batch_is_staged_before_the_previous_one_is_handed_over() -> None:
    copier = RecordingCopier()
    out = list(one_batch_ahead(iter([("a", 1), ("b", 2), ("c", 3)]), copier.stage, copier.hand_over))
    assert out == [("a", 1), ("b", 2), ("c", 3)]
    assert copier.events == [("stage", 1), ("stage", 2), ("hand over", 1), ("stage", 3), ("hand over", 2),
                             ("hand over", 3)]  # fmt: skip


def test_a_loader_copying_ahead_saves_the_position_of_the_batch_the_trainer_has(image_folder: Path) -> None:
    """The side-stream copy takes batch N+1 from the workers during step N; a checkpoint after step N must still
    resume at N+1, with the same batches as an uninterrupted epoch (bitwise)."""
    data = _data(image_folder)
    plain = make_backend(data).loader(LoaderSpec("train", 4, seed=3))
    ahead = make_backend(data).loader(LoaderSpec("train", 4, seed=3))
    ahead.copier = RecordingCopier()
    whole = list(plain)
    states, taken = [], []
    for batch in ahead:
        taken.append(batch)
        states.append(ahead.state_dict())
    assert len(taken) == len(whole) == 12 and all(torch.equal(a[0], b[0]) for a, b in zip(taken, whole))
    assert [s["consumed"] for s in states] == [4 * (k + 1) for k in range(12)]
    resumed = make_backend(data).loader(LoaderSpec("train", 4, seed=3))
    resumed.copier = RecordingCopier()
    resumed.load_state_dict(states[4])  # a checkpoint after the 5th step
    rest = list(resumed)
    assert len(rest) == 7 and all(torch.equal(a[0], b[0]) for a, b in zip(rest, whole[5:]))


def test_a_loader_copies_ahead_only_to_a_cuda_device(image_folder: Path) -> None:
    backend = make_backend(_data(image_folder))
    assert backend.loader(LoaderSpec("train", 4, device=torch.device("cpu"))).copier is None
    assert copier_for(None) is None and copier_for(torch.device("cpu")) is None
