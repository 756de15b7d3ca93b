"""The calibration images of INT8 quantization (post-training: ptq.py; quantization-aware training: qat.py).

N training images, picked with a seed and spread over the classes (round robin over the classes, each
class's files in a seeded order), read with the VALIDATION preprocessing: calibration measures the
activation ranges the deployed model sees, and deployment feeds val-preprocessed images (no random crops,
flips or RandAugment). QAT may read them with the TRAINING augmentation instead (`augment=True`,
recipe.qat.calibration_preprocessing=train), as NVIDIA's quant_main.py calibrates on its train loader
(quant_main.py:110-111): each image's augmentation drawn from a seed of (seed, image), so every rank and every
run sees the same augmented images. The files are read through the folder backend's dataset (data/images.py
CheckedImageFolder), so an undecodable file follows `data.on_bad_image` like in training: `skip` warns once
and the next file of the pick takes its place, `error` stops with its path. The split is listed as the backend
lists it (data/file_list.py FileList: ImageFolder's walk and order, held compactly), through
distributed.made_once: with a process group, rank 0 walks the split (ImageNet's train split: 1.28M files on
shared storage) and the others receive the list; without one, the process walks it itself, once.

Shard datasets (data.format=webdataset|tfrecord) are refused with one line: their records are read in
stream order, shard by shard, so a spread pick would read most of the split. Calibrate on a folder copy of a
few hundred training images (data.root=DIR).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from imgcls.config.schema import DataSchema
from imgcls.data.bad_images import BadImageLog, collate_dropping_bad
from imgcls.data.file_list import FileList
from imgcls.data.folder import classes_of, split_dir
from imgcls.data.images import CheckedImageFolder
from imgcls.data.transforms import train_transform, val_transform
from imgcls.distributed import made_once
from imgcls.errors import ConfigError
from imgcls.seeding import sample_seed
from imgcls.typed_config import settings


def spread_pick(targets: list[int], seed: int) -> list[int]:
    """Every index of `targets`, ordered so that any prefix is spread over the classes: a seeded order of the
    classes, then round robin, one seeded-shuffled file of each class per round (classes that run out drop out)."""
    generator = torch.Generator().manual_seed(int(seed))
    by_class: dict[int, list[int]] = {}
    for index, target in enumerate(targets):
        by_class.setdefault(int(target), []).append(index)
    classes = sorted(by_class)
    classes = [classes[i] for i in torch.randperm(len(classes), generator=generator).tolist()]
    queues = [[by_class[c][i] for i in torch.randperm(len(by_class[c]), generator=generator).tolist()] for c in classes]
    order: list[int] = []
    for position in range(max((len(q) for q in queues), default=0)):
        order.extend(q[position] for q in queues if position < len(q))
    return order


def calibration_dataset(data_cfg: DataSchema, preprocessing: dict, augment: bool = False) -> CheckedImageFolder:
    """The train split of data_cfg.root under the val transform of `preprocessing` (augment: data_cfg's train
    transform), its files listed once (made_once: by global rank 0 under DDP, the others receive the compact
    list) in ImageFolder's order."""
    fmt = str(data_cfg.format)
    if fmt != "folder":
        raise ConfigError(
            f"data.format={fmt}: calibration reads a folder dataset (ROOT/train/<class>/*); "
            "pass data.root=DIR of a folder copy of some training images"
        )
    root = data_cfg.root
    split_root = split_dir(root, "train")
    transform = train_transform(data_cfg) if augment else val_transform(settings(DataSchema, preprocessing))
    files = made_once(lambda: FileList(split_root, classes_of(root, "train")))
    return CheckedImageFolder(str(split_root), transform=transform, files=files)


def calibration_batches(
    data_cfg: DataSchema, preprocessing: dict, images: int, batch_size: int, seed: int = 0, augment: bool = False
) -> Iterator[torch.Tensor]:
    """`images` training images (fewer only if the split holds fewer good ones) in batches of `batch_size`
    (the last one may be smaller): float NCHW, normalized, fp32, the same for the same seed (augment: with the
    training augmentation, drawn per image from the seed)."""
    if not isinstance(images, int) or isinstance(images, bool) or images < 1:
        raise ConfigError(f"calibration.images={images} must be a positive whole number (e.g. 2048)")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"calibration.batch_size={batch_size} must be a positive whole number (e.g. 32)")
    dataset = calibration_dataset(data_cfg, preprocessing, augment)
    bad_images = BadImageLog(str(data_cfg.on_bad_image))
    assert dataset.files is not None, "calibration_dataset gives its dataset the split's file list"
    order: list = spread_pick(dataset.files.targets.tolist(), seed)
    if augment:  # (index, augmentation seed): CheckedImageFolder runs the transform under that seed
        order = [(index, sample_seed(seed, 0, index)) for index in order]
    workers = int(data_cfg.num_workers)
    # The whole pick order, read in batch_size chunks until enough good images are there: a skipped bad file
    # is replaced by the next one of the pick, not by a short calibration.
    # The items are CheckedImageFolder's: an (image, label) pair or a BadSample, typed Any there.
    loader: DataLoader[Any] = DataLoader(
        torch.utils.data.Subset(dataset, order),
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        collate_fn=collate_dropping_bad,
    )
    return _batches(loader, bad_images, images, batch_size)


def _batches(loader: DataLoader, bad_images: BadImageLog, images: int, batch_size: int) -> Iterator[torch.Tensor]:
    pending: list[torch.Tensor] = []
    held, given = 0, 0
    for batch, _, bad in loader:
        bad_images.record(bad)
        if len(batch):
            pending.append(batch)
            held += len(batch)
        while held >= batch_size and given < images:
            joined = torch.cat(pending)
            take = min(batch_size, images - given)
            yield joined[:take].float().contiguous()
            given += take
            rest = joined[take:]
            pending, held = ([rest] if len(rest) else []), len(rest)
        if given >= images:
            return
    if held and given < images:
        yield torch.cat(pending)[: images - given].float().contiguous()
