"""Bad images: what counts as one, the `data.on_bad_image` policy, and the log of the files a run skipped.

A file that cannot be decoded completely (zero bytes, not an image, truncated, larger than MAX_PIXELS) is a
"bad image". Neither backend raises for one while loading:
- torchvision: the dataset (images.CheckedImageFolder) returns a BadSample marker, `collate_dropping_bad`
  drops it from its batch, and the loader (in the main process, where one warning per file and one count
  are possible) hands it to the BadImageLog. Deciding in the main process also keeps the error one line: an
  exception raised inside a DataLoader worker comes back wrapped in its traceback text.
- DALI: the pipeline checks each encoded file as the reader hands it over (image_scan.scan_bytes, from
  dali/pipelines.py check_encoded), decodes a placeholder instead of a bad one, and the loader drops it and
  hands it to the BadImageLog.
The log applies the policy: `skip` warns once per file and goes on with the rest of the batch; `error` stops
with the file's path. callbacks/bad_image_report.py puts the skipped files of every rank into report.json.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from PIL import Image, ImageFile
from torch.utils.data import default_collate

from imgcls.errors import DataError

T = TypeVar("T")

log = logging.getLogger(__name__)

# PIL's own decompression-bomb limit (Image.MAX_IMAGE_PIXELS's default, 89.5 MP: 9459x9459, 268 MB as RGB); a
# larger image is a bad image. A few-hundred-KB file can declare far more (a 12000x12000 PNG: 144 MP, over 1 GB
# to decode and convert), and every DataLoader worker may decode one at once. A 12000x9000 photo (108 MP) is
# over it too: resize such images before training, or raise data.max_image_pixels (set_max_pixels).
MAX_PIXELS = 89_478_485
Image.MAX_IMAGE_PIXELS = MAX_PIXELS
_max_pixels = MAX_PIXELS


def set_max_pixels(pixels: int) -> None:
    """data.max_image_pixels for this process and the DataLoader workers it forks (and PIL's own bomb check, which
    refuses twice its limit): the DataModule sets it before any loader is built."""
    global _max_pixels
    _max_pixels = int(pixels)
    Image.MAX_IMAGE_PIXELS = _max_pixels


def max_pixels() -> int:
    """The largest image (width x height) that is decoded; a larger one is a bad image."""
    return _max_pixels


ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is bad, not half grey (PIL's default, made explicit)


class BadImage(Exception):
    """A file that is not a completely decodable image."""


@dataclass(frozen=True)
class BadSample:
    """What the dataset returns instead of a sample; crosses worker queues (picklable)."""

    path: str
    reason: str


def collate_dropping_bad(samples: list[Any]) -> tuple[Any, ...]:
    """(images, labels, bad samples): the batch keeps its other samples when some files are bad."""
    good = [s for s in samples if not isinstance(s, BadSample)]
    bad = [s for s in samples if isinstance(s, BadSample)]
    if good:
        images, labels = default_collate(good)
    else:  # every file of the batch was bad: an empty batch, which the loader does not yield
        images, labels = torch.empty(0), torch.empty(0, dtype=torch.int64)
    return images, labels, bad


def equal_step_counts(batches: Iterable[T | None], refill: bool, owed: int = 0) -> Iterator[T]:
    """The usable batches of an epoch; `None` marks one that bad files left unusable (empty, or a single sample
    in training). On one process it is skipped. Under DDP (`refill`) every rank must take the same number of
    steps, or the others wait in the next collective for one that ended its epoch early: the next usable batch
    is yielded once more for each skipped one (at an epoch's end, the last one). That is the next batch, not an
    earlier one, because a DALI batch's buffers may be refilled once the consumer has moved past it. `owed`: the
    repeats already owed when the epoch was interrupted (a DALI loader resumed mid-epoch)."""
    last = None
    for batch in batches:
        if batch is None:
            owed += refill
            continue
        last = batch
        for _ in range(1 + owed):
            yield batch
        owed = 0
    if last is not None:
        for _ in range(owed):
            yield last


class BadImageLog:
    """Main-process record of bad files: one warning per file, the policy, and the list for report.json."""

    def __init__(self, policy: str) -> None:
        self.policy = policy  # data.on_bad_image, checked by config.checks
        self.files: dict[str, str] = {}

    def record(self, bad: list[BadSample]) -> None:
        for sample in bad:
            if self.policy == "error":
                raise DataError(
                    f"{sample.path} is not a decodable image ({sample.reason}); "
                    "data.on_bad_image=error (allowed: skip, error)"
                )
            if sample.path not in self.files:
                self.files[sample.path] = sample.reason
                log.warning("skipping bad image %s (%s); data.on_bad_image=skip", sample.path, sample.reason)
