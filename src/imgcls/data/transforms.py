"""Train and val transforms of the torchvision backend, built with timm's transform factory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timm.data import create_transform

from imgcls.data.augment import augment_policy


def train_transform(cfg: Any, image_size: int | None = None) -> Callable:
    """RandomResizedCrop (area, aspect, interpolation per recipe) -> flip -> [policy] -> normalize."""
    return create_transform(
        image_size or cfg.image_size,
        is_training=True,
        scale=tuple(cfg.train_crop_scale),
        ratio=tuple(cfg.train_crop_ratio),
        hflip=float(cfg.hflip),
        vflip=0.0,
        color_jitter=None,  # NVIDIA's recipes use none (timm's default would add 0.4)
        auto_augment=augment_policy(cfg),
        interpolation=cfg.interpolation,
        mean=tuple(cfg.mean),
        std=tuple(cfg.std),
    )


def val_transform(cfg: Any, image_size: int | None = None) -> Callable:
    """Resize the shorter side to size / crop_pct (256 for 224), center crop, normalize."""
    return create_transform(
        image_size or cfg.image_size,
        is_training=False,
        crop_pct=float(cfg.val_crop_pct),
        interpolation=cfg.interpolation,
        mean=tuple(cfg.mean),
        std=tuple(cfg.std),
    )
