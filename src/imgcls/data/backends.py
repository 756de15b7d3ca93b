"""Data backends. Each one turns the data config into train/val loaders for one rank.

The LightningModule never sees which backend runs; a new backend (DALI) registers itself in BACKENDS.
A backend yields (images NCHW, labels int64) batches: uint8 images from the worker processes (torchvision), which
the DataModule normalizes on the device, or float images normalized on the device already (DALI, synthetic).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from imgcls.data.augment import with_magnitude
from imgcls.data.bad_images import BadImageLog, collate_dropping_bad
from imgcls.data.device_prefetch import copier_for
from imgcls.data.file_list import FileList
from imgcls.data.folder import check_same_classes, classes_of, split_dir
from imgcls.data.images import CheckedImageFolder
from imgcls.data.samplers import RankSampler, ResumableDataLoader
from imgcls.data.shards.manifest import open_shard_set
from imgcls.data.shards.stream import ShardRecords, ShardStreamSampler, StopOnRefused
from imgcls.data.synthetic import SyntheticBatches
from imgcls.data.transforms import train_transform, val_transform
from imgcls.distributed import made_once
from imgcls.errors import ConfigError, DataError


class TorchvisionBackend:
    """ImageFolder + PIL decoding + torchvision/timm transforms in DataLoader worker processes.

    Subclasses change where the samples come from (_make_dataset) and in which order (_sampler)."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.classes = self._classes()
        self._datasets: dict[str, Any] = {}
        self._files: dict[str, FileList] = {}
        self.bad_images = BadImageLog(str(cfg.get("on_bad_image") or "skip"))

    def _classes(self) -> list[str]:
        classes = classes_of(self.cfg.root, "train")
        check_same_classes(classes, classes_of(self.cfg.root, "val"), self.cfg.root)
        return classes

    def _make_dataset(self, split: str, transform: Callable) -> Any:
        root = split_dir(self.cfg.root, split)
        if split not in self._files:
            # One rank walks the tree (1.33M entries on ImageNet, seconds to minutes on network storage) and sends
            # the compact list (~4 MB) to the others, which would each walk it again (DALI: dali/backend.py).
            self._files[split] = made_once(lambda: FileList(root, self.classes))
        return CheckedImageFolder(str(root), transform=transform, files=self._files[split])

    def _sampler(self, dataset: Any, split: str, batch_size: int, rank: int, world_size: int, seed: int) -> RankSampler:
        training = split == "train"
        return RankSampler(
            len(dataset), rank, world_size, shuffle=training, seed=seed, drop_last=training, per_sample_seeds=training
        )

    def _bad_sample_sink(self) -> Any:
        return self.bad_images

    def dataset(self, split: str, image_size: int | None = None, augment_magnitude: int | None = None) -> Any:
        key = f"{split}@{image_size}@{augment_magnitude}"
        if key not in self._datasets:
            self._datasets[key] = self._make_dataset(split, _transform(self.cfg, split, image_size, augment_magnitude))
        return self._datasets[key]

    def loader(
        self,
        split: str,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        image_size: int | None = None,
        augment_magnitude: int | None = None,
        first_epoch: int = 0,  # DALI's; the sampler here draws every epoch's order from (seed, epoch) itself
        device: Any = None,  # the training device (Lightning copies the batches there)
    ) -> DataLoader:
        dataset = self.dataset(split, image_size, augment_magnitude)
        sampler = self._sampler(dataset, split, batch_size, rank, world_size, seed)
        sink, copier = self._bad_sample_sink(), copier_for(device)
        return _dataloader(dataset, sampler, batch_size, self.cfg, split == "train", bad_images=sink, copier=copier)


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
            self.cfg.get("shard_cache"),  # null (an older checkpoint's config): remote.py says so for a URL
            OmegaConf.to_container(self.cfg.storage_options) if self.cfg.get("storage_options") else {},
        )

    def _sampler(
        self, dataset: Any, split: str, batch_size: int, rank: int, world_size: int, seed: int
    ) -> ShardStreamSampler:
        training = split == "train"
        counts = [s.count for s in self.shard_set.splits[split]]
        if training and sum(counts) < world_size * batch_size:
            raise DataError(
                f"data.root={self.cfg.root} has {sum(counts)} train samples, fewer than one batch on each rank "
                f"({world_size} x data.batch_size={batch_size})"
            )
        return ShardStreamSampler(counts, rank, world_size, batch_size, int(self.cfg.num_workers), training, seed)

    def _bad_sample_sink(self) -> Any:
        return StopOnRefused(self.bad_images)  # a worker's refusal (bad label, short shard) raised in one line


class SyntheticBackend:
    """One batch made on the training device, reused every step (data/synthetic.py); measures the model without any
    input pipeline (NVIDIA --data-backend synthetic)."""

    def __init__(self, cfg: Any) -> None:
        if not cfg.get("num_classes"):
            raise ConfigError("data.num_classes must be set for the synthetic backend (e.g. 1000)")
        self.cfg = cfg
        self.classes = [str(i) for i in range(int(cfg.num_classes))]
        self.bad_images = BadImageLog("skip")  # generated tensors: never a bad file, but the same interface

    def loader(
        self, split: str, batch_size: int, rank: int, world_size: int, seed: int, device: Any = None, **_: Any
    ) -> SyntheticBatches:
        # Progressive resizing does not apply: synthetic images keep the model's size.
        training = split == "train"
        count = int(self.cfg.get("train_samples" if training else "val_samples") or 1024)
        per_rank = count // world_size
        steps = per_rank // batch_size if training else -(-per_rank // batch_size)  # train drops the last partial
        return SyntheticBatches(
            max(steps, 1), batch_size, int(self.cfg.image_size), len(self.classes),
            seed=seed * 1_000_003 + 2 * rank + (0 if training else 1),  # a fresh batch per split and rank
            channels_last=bool(self.cfg.get("channels_last")), device=device,
        )  # fmt: skip


def _transform(cfg: Any, split: str, image_size: int | None, augment_magnitude: int | None) -> Callable:
    if augment_magnitude is not None:  # progressive augmentation: the same policy, another magnitude
        cfg = OmegaConf.merge(cfg, {"randaugment": with_magnitude(str(cfg.randaugment), augment_magnitude)})
    # uint8 out of the workers: a quarter of float32's bytes to collate, pin and copy (data/device_normalize.py)
    return (train_transform if split == "train" else val_transform)(cfg, image_size, normalize=False)


def _dataloader(
    dataset: Any,
    sampler: RankSampler,
    batch_size: int,
    cfg: Any,
    drop_last: bool,
    bad_images: Any = None,
    copier: Any = None,
) -> DataLoader:
    workers = int(cfg.num_workers)
    return ResumableDataLoader(  # stateful: Lightning resumes it mid-epoch
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=bool(cfg.pin_memory),
        drop_last=drop_last,
        persistent_workers=bool(cfg.persistent_workers) and workers > 0,
        prefetch_factor=int(cfg.prefetch_factor) if workers > 0 else None,
        collate_fn=collate_dropping_bad,
        bad_images=bad_images,
        copier=copier,
        # Its own generator: creating an iterator then draws no number from the global torch RNG, so a run
        # resumed mid-epoch (one extra iter()) keeps the same random stream as an uninterrupted one.
        generator=torch.Generator().manual_seed(int(sampler.seed)),
    )


def _dali(device: str) -> Callable[[Any], Any]:
    """Import DALI only when a DALI backend is chosen; a missing package is a one-line config error."""

    def build(cfg: Any) -> Any:
        try:
            from imgcls.data.dali.backend import DaliBackend
        except ImportError as exc:
            raise ConfigError(
                f"data.backend={cfg.backend} needs NVIDIA DALI, which does not import here ({exc}); "
                "pip install nvidia-dali-cuda120 (or -cuda130), or use data.backend=torchvision"
            ) from None
        return DaliBackend(cfg, device)

    return build


def _torchvision(cfg: Any) -> Any:
    # data.format is the layout on disk; the backend reads any of them (DALI: data/dali, its own readers).
    return TorchvisionBackend(cfg) if str(cfg.get("format") or "folder") == "folder" else ShardBackend(cfg)


BACKENDS: dict[str, Callable[[Any], Any]] = {
    "torchvision": _torchvision,
    "synthetic": SyntheticBackend,
    "dali_cpu": _dali("cpu"),  # DALI decode + augment on CPU threads (NVIDIA: DGX-1, DGX A100)
    "dali_gpu": _dali("gpu"),  # nvJPEG decode + GPU augment (NVIDIA: DGX-2)
}


def make_backend(cfg: Any) -> Any:
    name = cfg.backend
    if name not in BACKENDS:
        raise ConfigError(f"data.backend={name} is not a known backend; allowed: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name](cfg)
