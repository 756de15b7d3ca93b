"""Data backends. Each one turns the data config into train/val loaders for one rank.

The LightningModule never sees which backend runs; a new backend (DALI) registers itself in BACKENDS.
A backend yields (images float NCHW normalized, labels int64) batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from imgcls.data.folder import check_same_classes, classes_of, split_dir
from imgcls.data.samplers import ShardSampler
from imgcls.data.synthetic import SyntheticImages
from imgcls.data.transforms import train_transform, val_transform
from imgcls.errors import ConfigError


class TorchvisionBackend:
    """ImageFolder + PIL decoding + torchvision/timm transforms in DataLoader worker processes."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.classes = classes_of(cfg.root, "train")
        check_same_classes(self.classes, classes_of(cfg.root, "val"), cfg.root)
        self._datasets: dict[str, ImageFolder] = {}

    def dataset(self, split: str, image_size: int | None = None) -> ImageFolder:
        transform = (train_transform if split == "train" else val_transform)(self.cfg, image_size)
        key = f"{split}@{image_size}"
        if key not in self._datasets:
            self._datasets[key] = ImageFolder(str(split_dir(self.cfg.root, split)), transform=transform)
        return self._datasets[key]

    def loader(self, split: str, batch_size: int, rank: int, world_size: int, seed: int) -> DataLoader:
        dataset = self.dataset(split)
        training = split == "train"
        sampler = ShardSampler(len(dataset), rank, world_size, shuffle=training, seed=seed, drop_last=training)
        return _dataloader(dataset, sampler, batch_size, self.cfg, drop_last=training)


class SyntheticBackend:
    """Random tensors; measures the model without any input pipeline (NVIDIA --data-backend synthetic)."""

    def __init__(self, cfg: Any) -> None:
        if not cfg.get("num_classes"):
            raise ConfigError("data.num_classes must be set for the synthetic backend (e.g. 1000)")
        self.cfg = cfg
        self.classes = [str(i) for i in range(int(cfg.num_classes))]

    def loader(self, split: str, batch_size: int, rank: int, world_size: int, seed: int) -> DataLoader:
        training = split == "train"
        count = int(self.cfg.get("train_samples" if training else "val_samples") or 1024)
        dataset = SyntheticImages(count, int(self.cfg.image_size), len(self.classes), seed=1 if training else 2)
        sampler = ShardSampler(count, rank, world_size, shuffle=training, seed=seed, drop_last=training)
        return _dataloader(dataset, sampler, batch_size, self.cfg, drop_last=training)


def _dataloader(dataset: Any, sampler: ShardSampler, batch_size: int, cfg: Any, drop_last: bool) -> DataLoader:
    workers = int(cfg.num_workers)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=bool(cfg.pin_memory),
        drop_last=drop_last,
        persistent_workers=bool(cfg.persistent_workers) and workers > 0,
        prefetch_factor=int(cfg.prefetch_factor) if workers > 0 else None,
    )


BACKENDS: dict[str, Callable[[Any], Any]] = {
    "torchvision": TorchvisionBackend,
    "synthetic": SyntheticBackend,
}


def make_backend(cfg: Any) -> Any:
    name = cfg.backend
    if name not in BACKENDS:
        raise ConfigError(f"data.backend={name} is not a known backend; allowed: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[name](cfg)
