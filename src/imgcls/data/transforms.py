"""Train and val transforms of the torchvision backend, built with timm's transform factory."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from PIL import Image
from timm.data import create_transform
from timm.data.auto_augment import auto_augment_transform
from torchvision.transforms import Compose

from imgcls.data.augment import augment_policy, autoaugment_hparams, with_nvidia_ops
from imgcls.data.tf_crop import TFDistortedCrop, crop_spec

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema


def train_transform(cfg: DataSchema, image_size: int | None = None, normalize: bool = True) -> Callable:
    """RandomResizedCrop (area, aspect, interpolation per recipe; data.train_crop=tf: TF's sampler,
    data/tf_crop.py) -> flip -> [policy] -> normalize.

    normalize=False ends with a uint8 CHW tensor instead (the training loaders: normalized on the device,
    data/device_normalize.py)."""
    size = int(image_size or cfg.image_size)
    policy = augment_policy(cfg)
    autoaugment = cfg.augment == "autoaugment"
    stages = create_transform(
        size,
        is_training=True,
        scale=(cfg.train_crop_scale[0], cfg.train_crop_scale[1]),
        ratio=(cfg.train_crop_ratio[0], cfg.train_crop_ratio[1]),
        hflip=float(cfg.hflip),
        vflip=0.0,
        # NVIDIA's recipes use none (timm's default would add 0.4); timm's annotation omits the None it reads as none
        color_jitter=None,  # type: ignore[arg-type]
        # timm would build AutoAugment with a translation of 0.45 x the image and the dataset mean as fill:
        # built below with NVIDIA's instead.
        auto_augment=None if autoaugment else policy,
        interpolation=cfg.interpolation,
        mean=tuple(cfg.mean),
        std=tuple(cfg.std),
        normalize=normalize,
        separate=True,
    )
    primary, secondary, final = (list(stage.transforms) for stage in stages)
    if cfg.train_crop == "tf":
        primary[0] = TFDistortedCrop(size, crop_spec(cfg), interpolation=str(cfg.interpolation))
    if autoaugment and policy is not None:
        # Rotate, Shear and Translate sample the nearest pixel, as TF2 (augment.py:178-181) and NVIDIA PyTorch's
        # Rotate and Translate (IC/autoaugment.py:89-92, 113-118), not the resize's interpolation; NVIDIA PyTorch's
        # Shear is bicubic (:107-112), which with_nvidia_ops sets for data.autoaugment_ops=pytorch.
        hparams = autoaugment_hparams(size, Image.Resampling.NEAREST)
        ops = str(cfg.autoaugment_ops)
        secondary = [with_nvidia_ops(auto_augment_transform(policy, hparams), ops)]
    return Compose(primary + secondary + final)


def val_resize_size(cfg: DataSchema, image_size: int) -> int:
    """The shorter side val images are resized to before the centre crop, for every backend.

    data.val_crop_padding=P: image_size + P, NVIDIA's protocol (PyTorch get_pytorch_val_loader and DALI
    HybridValPipe crop_padding 32: 256 for 224, 412 for B4's 380; TF1 resizes to 256 for 224). Otherwise
    timm's floor(image_size / data.val_crop_pct) (434 for 380 at 0.875)."""
    padding = cfg.val_crop_padding
    if padding is not None:
        return int(image_size) + int(padding)
    return math.floor(int(image_size) / float(cfg.val_crop_pct))


def val_transform(cfg: DataSchema, image_size: int | None = None, normalize: bool = True) -> Callable:
    """Resize the shorter side to val_resize_size (256 for 224), center crop, normalize (normalize=False: uint8)."""
    size = int(image_size or cfg.image_size)
    resize = val_resize_size(cfg, size)
    return create_transform(
        size,
        is_training=False,
        # timm resizes to floor(size / crop_pct); nudged up so float rounding cannot land one pixel short.
        crop_pct=size / (resize + 1e-6),
        interpolation=cfg.interpolation,
        mean=tuple(cfg.mean),
        std=tuple(cfg.std),
        normalize=normalize,
    )
