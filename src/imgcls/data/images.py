"""Image decoding that survives real-world files, and the `data.on_bad_image` policy.

Decodable files of any mode become 8-bit RGB (CMYK, grayscale, palette/GIF, RGBA, 16-bit PNG; the file's
content decides the format, not its name). A file that cannot be decoded completely (zero bytes, not an
image, truncated, larger than MAX_PIXELS) is a "bad image". The dataset never raises for one: it returns
a BadSample marker, the collate drops it from the batch, and the loader (in the main process, where one
warning per file and one count are possible) applies the policy: `skip` warns once per file and goes on
with the rest of the batch; `error` stops with the file's path. Deciding in the main process also keeps the
error one line: an exception raised inside a DataLoader worker comes back wrapped in its traceback text.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFile
from torch.utils.data import default_collate
from torchvision.datasets import ImageFolder

from imgcls.errors import ConfigError, DataError
from imgcls.seeding import seeded

log = logging.getLogger(__name__)

# PIL warns above 89.5 MP and refuses above 179 MP (decompression-bomb guard); a 12000x9000 photo is 108 MP.
# We allow up to 2^28 pixels (16384x16384, 805 MB as RGB) and treat anything larger as a bad image.
MAX_PIXELS = 1 << 28
Image.MAX_IMAGE_PIXELS = MAX_PIXELS
ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is bad, not half grey (PIL's default, made explicit)

POLICIES = ("skip", "error")


class BadImage(Exception):
    """A file that is not a completely decodable image."""


@dataclass(frozen=True)
class BadSample:
    """What the dataset returns instead of a sample; crosses worker queues (picklable)."""

    path: str
    reason: str


def load_rgb(path: str) -> Image.Image:
    """Decode the whole file (so truncation is detected now, not in a transform) into 8-bit RGB."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                if image.width * image.height > MAX_PIXELS:
                    raise BadImage(f"{image.width}x{image.height} is larger than {MAX_PIXELS} pixels")
                image.load()
                return to_rgb(image)
    except BadImage:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadImage(f"{type(exc).__name__}: {exc}") from None


def to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16-bit grayscale: PIL's convert("RGB") clips at 255 (a white image); scale to 8 bits instead.
        array = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if image.mode.startswith("I;16") or array.max() > 255 else 255.0
        image = Image.fromarray(np.clip(array * (255.0 / peak) + 0.5, 0, 255).astype(np.uint8), "L")
    elif image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # PIL asks for this before dropping palette transparency
    return image.convert("RGB")  # RGBA: alpha dropped (as torchvision's loader); CMYK/L/LA/P: converted


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ConfigError(f"data.on_bad_image={policy} is not allowed; use skip or error")
    return policy


class CheckedImageFolder(ImageFolder):
    """ImageFolder whose __getitem__ returns a BadSample for an undecodable file instead of raising."""

    def __init__(self, root: str, transform: Any) -> None:
        super().__init__(root, transform=transform, loader=load_rgb)

    def __getitem__(self, index: int | tuple[int, int]) -> Any:
        seed = None
        if isinstance(index, tuple):  # (index, augmentation seed) from ShardSampler(per_sample_seeds=True)
            index, seed = index
        path, target = self.samples[index]
        try:
            image = self.loader(path)
        except BadImage as exc:
            return BadSample(path, str(exc))
        if seed is None:
            return self.transform(image), target
        with seeded(seed):
            return self.transform(image), target


def collate_dropping_bad(samples: list[Any]) -> tuple[Any, ...]:
    """(images, labels, bad samples): the batch keeps its other samples when some files are bad."""
    good = [s for s in samples if not isinstance(s, BadSample)]
    bad = [s for s in samples if isinstance(s, BadSample)]
    if good:
        images, labels = default_collate(good)
    else:  # every file of the batch was bad: an empty batch, which the loader does not yield
        images, labels = torch.empty(0), torch.empty(0, dtype=torch.int64)
    return images, labels, bad


class BadImageLog:
    """Main-process record of bad files: one warning per file, the policy, and the list for report.json."""

    def __init__(self, policy: str) -> None:
        self.policy = check_policy(policy)
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


# --- pre-scan for backends that cannot skip a file while decoding (DALI) --------------------------------------
# DALI's decoder stops the whole pipeline on one undecodable file, and it does not decode GIF. A full decode of
# every file before training would cost about a CPU-hour on ImageNet, so the scan is structural: the header must
# parse (PIL), the format must be one DALI decodes, the size must be within MAX_PIXELS, and a JPEG/PNG must end
# with its end marker (a truncated file does not). A file damaged in the middle with intact ends passes the scan.
DALI_FORMATS = {"JPEG", "PNG", "TIFF", "BMP", "PPM", "JPEG2000", "WEBP", "MPO"}
_END_MARKERS = {"JPEG": b"\xff\xd9", "MPO": b"\xff\xd9", "PNG": b"IEND\xaeB`\x82"}


def scan_file(path: str, formats: set[str] = DALI_FORMATS) -> str | None:
    """None if `path` looks decodable (see above), else the reason."""
    try:
        with Image.open(path) as image:
            fmt, pixels = image.format or "?", image.width * image.height
        if fmt not in formats:
            return f"{fmt} is not decoded by this backend"
        if pixels > MAX_PIXELS:
            return f"larger than {MAX_PIXELS} pixels"
        marker = _END_MARKERS.get(fmt)
        if marker is not None:
            with open(path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 4096))
                if marker not in f.read():
                    return f"truncated {fmt} (no end marker)"
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return f"{type(exc).__name__}: {exc}"
    except Image.DecompressionBombWarning as exc:  # only when warnings are errors
        return str(exc)
    return None


def prescan(samples: list[tuple[str, int]], bad_images: BadImageLog, threads: int = 16) -> list[tuple[str, int]]:
    """The samples whose files pass scan_file; the others go through the on_bad_image policy."""
    from concurrent.futures import ThreadPoolExecutor  # I/O bound: a few small reads per file

    with ThreadPoolExecutor(max(1, threads)) as pool:
        reasons = list(pool.map(scan_file, (path for path, _ in samples), chunksize=256))
    bad_images.record([BadSample(path, reason) for (path, _), reason in zip(samples, reasons) if reason])
    return [sample for sample, reason in zip(samples, reasons) if reason is None]
