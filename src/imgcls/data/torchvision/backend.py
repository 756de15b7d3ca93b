"""The torchvision backend (data.backend=torchvision): ImageFolder or shard files, PIL decoding and torchvision/timm
transforms in DataLoader worker processes. Batches leave the workers as uint8 and are normalized on the training
device (on_device, data/device_normalize.py); a CUDA device gets them copied one step ahead (data/device_prefetch.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from omegaconf import OmegaConf

from imgcls.data.augment import with_magnitude
from imgcls.data.bad_images import BadImageLog, collate_dropping_bad
from imgcls.data.device_normalize import DeviceNormalize
from imgcls.data.device_prefetch import copier_for
from imgcls.data.file_list import FileList
from imgcls.data.folder import folder_classes, split_dir
from imgcls.data.images import CheckedImageFolder
from imgcls.data.protocol import LoaderSpec
from imgcls.data.shards.manifest import open_shard_set
from imgcls.data.shards.stream import ShardRecords, ShardStreamSampler, StopOnRefused
from imgcls.data.tf_crop import uses_object_boxes
from imgcls.data.torchvision.samplers import RankSampler, ResumableDataLoader
from imgcls.data.transforms import train_transform, val_transform
from imgcls.distributed import made_once
from imgcls.errors import DataError
from imgcls.typed_config import to_dict

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema


class TorchvisionBackend:
    """ImageFolder + PIL decoding + torchvision/timm transforms in DataLoader worker processes.

    Subclasses change where the samples come from (_make_dataset) and in which order (_sampler)."""

    def __init__(self, cfg: DataSchema) -> None:
        self.cfg = cfg
        self.classes = self._classes()
        self._datasets: dict[str, Any] = {}
        self._files: dict[str, FileList] = {}
        self.bad_images = BadImageLog(str(cfg.on_bad_image))
        self.normalize = DeviceNormalize(cfg.mean, cfg.std, channels_last=cfg.channels_last)

    def _classes(self) -> list[str]:
        return folder_classes(self.cfg.root, self.cfg.class_names)

    def _make_dataset(self, split: str, transform: Callable) -> Any:
        root = split_dir(self.cfg.root, split)
        if split not in self._files:
            # One rank walks the tree (1.33M entries on ImageNet, seconds to minutes on network storage) and sends
            # the compact list (~4 MB) to the others, which would each walk it again (DALI: dali/backend.py).
            self._files[split] = made_once(lambda: FileList(root, self.classes))
        return CheckedImageFolder(str(root), transform=transform, files=self._files[split])

    def _sampler(self, dataset: Any, spec: LoaderSpec) -> RankSampler:
        training = spec.split == "train"
        return RankSampler(
            len(dataset), spec.rank, spec.world_size, shuffle=training, seed=spec.seed, drop_last=training,
            per_sample_seeds=training,
        )  # fmt: skip

    def _bad_sample_sink(self) -> Any:
        return self.bad_images

    def dataset(self, split: str, image_size: int | None = None, augment_magnitude: int | None = None) -> Any:
        key = f"{split}@{image_size}@{augment_magnitude}"
        if key not in self._datasets:
            self._datasets[key] = self._make_dataset(split, _transform(self.cfg, split, image_size, augment_magnitude))
        return self._datasets[key]

    def loader(self, spec: LoaderSpec) -> ResumableDataLoader:
        """Every epoch's order and augmentation seeds come from (seed, epoch) in the sampler, so `first_epoch` is
        not needed; `resume`: the state a train loader's state_dict() returned (the sampler's epoch and place,
        the same on every rank)."""
        dataset = self.dataset(spec.split, spec.image_size, spec.augment_magnitude)
        sampler = self._sampler(dataset, spec)
        sink, copier = self._bad_sample_sink(), copier_for(spec.device)
        training = spec.split == "train"
        return _dataloader(dataset, sampler, spec.batch_size, self.cfg, training, bad_images=sink, copier=copier)

    def on_device(self, batch: Any) -> Any:
        return (self.normalize(batch[0]), *batch[1:])  # labels as they are


class ShardBackend(TorchvisionBackend):
    """data.format=webdataset|tfrecord on the torchvision path: shard files read whole by the DataLoader
    workers, the same PIL decoding, transforms and bad-image policy as the folder (data/shards/stream.py)."""

    def _classes(self) -> list[str]:
        self.shard_set = open_shard_set(self.cfg)
        return list(self.shard_set.classes)

    def _make_dataset(self, split: str, transform: Callable) -> ShardRecords:
        return ShardRecords(
            self.shard_set,
            split,
            transform,
            self.cfg.shard_cache,
            to_dict(self.cfg.storage_options, resolve=True),
            object_boxes=split == "train" and uses_object_boxes(self.cfg),
        )

    def _sampler(self, dataset: Any, spec: LoaderSpec) -> ShardStreamSampler:
        training = spec.split == "train"
        counts = [s.count for s in self.shard_set.splits[spec.split]]
        if training and sum(counts) < spec.world_size * spec.batch_size:
            raise DataError(
                f"data.root={self.cfg.root} has {sum(counts)} train samples, fewer than one batch on each rank "
                f"({spec.world_size} x data.batch_size={spec.batch_size})"
            )
        workers = int(self.cfg.num_workers)
        return ShardStreamSampler(counts, spec.rank, spec.world_size, spec.batch_size, workers, training, spec.seed)

    def _bad_sample_sink(self) -> Any:
        return StopOnRefused(self.bad_images)  # a worker's refusal (bad label, short shard) raised in one line


def _transform(cfg: DataSchema, split: str, image_size: int | None, augment_magnitude: int | None) -> Callable:
    if augment_magnitude is not None:  # progressive augmentation: the same policy, another magnitude
        policy = with_magnitude(str(cfg.randaugment), augment_magnitude)
        cfg = cast("DataSchema", OmegaConf.merge(cfg, {"randaugment": policy}))
    # uint8 out of the workers: a quarter of float32's bytes to collate, pin and copy (data/device_normalize.py)
    return (train_transform if split == "train" else val_transform)(cfg, image_size, normalize=False)


def _dataloader(
    dataset: Any,
    sampler: RankSampler,
    batch_size: int,
    cfg: DataSchema,
    drop_last: bool,
    bad_images: Any = None,
    copier: Any = None,
) -> ResumableDataLoader:
    workers = int(cfg.num_workers)
    return ResumableDataLoader(  # stateful: Lightning resumes it mid-epoch
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=bool(cfg.pin_memory),
        drop_last=drop_last,
        persistent_workers=bool(cfg.persistent_workers) and workers > 0,
        prefetch_factor=cfg.prefetch_factor if workers > 0 else None,  # null: PyTorch's default
        collate_fn=collate_dropping_bad,
        bad_images=bad_images,
        copier=copier,
        # Its own generator: creating an iterator then draws no number from the global torch RNG, so a run
        # resumed mid-epoch (one extra iter()) keeps the same random stream as an uninterrupted one.
        generator=torch.Generator().manual_seed(int(sampler.seed)),
    )


def make_torchvision_backend(cfg: DataSchema) -> TorchvisionBackend:
    # data.format is the layout on disk; the backend reads any of them (DALI: data/dali, its own readers).
    return TorchvisionBackend(cfg) if str(cfg.format) == "folder" else ShardBackend(cfg)
