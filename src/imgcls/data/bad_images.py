"""Bad images, in one place: what counts as one, the `data.on_bad_image` policy, the log of the files a run
skipped, and its report.

A file that cannot be decoded completely (zero bytes, not an image, truncated, larger than MAX_PIXELS) is a
"bad image". Neither backend raises for one while loading:
- torchvision: the dataset (images.CheckedImageFolder) returns a BadSample marker, `collate_dropping_bad`
  drops it from its batch, and the loader (in the main process, where one warning per file and one count
  are possible) hands it to the BadImageLog. Deciding in the main process also keeps the error one line: an
  exception raised inside a DataLoader worker comes back wrapped in its traceback text.
- DALI: the pipeline checks each encoded file as the reader hands it over (`scan_bytes`, from
  dali/pipelines.py check_encoded), decodes a placeholder instead of a bad one, and the loader drops it and
  hands it to the BadImageLog.
The log applies the policy: `skip` warns once per file and goes on with the rest of the batch; `error` stops
with the file's path. BadImageReport puts the skipped files of every rank into report.json.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import lightning as L
import numpy as np
import torch
from PIL import Image, ImageFile, UnidentifiedImageError
from torch.utils.data import default_collate

from imgcls.callbacks.report import ReportCallback
from imgcls.distributed import gather_objects
from imgcls.errors import ConfigError, DataError

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


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ConfigError(f"data.on_bad_image={policy} is not allowed; use skip or error")
    return policy


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


# --- structural check for backends that cannot skip a file while decoding (DALI) -----------------------------
# DALI's decoder stops the whole pipeline on one undecodable file, and it does not decode GIF. The DALI pipelines
# check each encoded file as the reader hands it over (dali/pipelines.py), before the decoder sees it; a full
# decode would cost as much as the decode itself, so the check is structural: the header must parse (PIL), the
# format must be one DALI decodes, the size must be within MAX_PIXELS, and a JPEG/PNG must end with its end
# marker (a truncated file does not). A file damaged in the middle with intact ends passes the check.
DALI_FORMATS = {"JPEG", "PNG", "TIFF", "BMP", "PPM", "JPEG2000", "WEBP", "MPO"}
_END_MARKERS = {"JPEG": b"\xff\xd9", "MPO": b"\xff\xd9", "PNG": b"IEND\xaeB`\x82"}


# JPEG start-of-frame markers (baseline, extended, progressive, lossless; not DHT/JPG/DAC), whose segment
# holds the height and width; and the markers without a length field.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}


def _plain_jpeg(data: memoryview) -> bool:
    """True for a JPEG with SOI, a frame header of 1, 3 or 4 components within MAX_PIXELS, and an end marker.

    The check DALI's pipeline runs on every file it reads (dali/pipelines.py check_encoded), so the common case
    is walked here without PIL's parser objects and copy of the file, several times faster.
    False is not a verdict: scan_bytes then asks PIL."""
    size = len(data)
    if size < 4 or data[0] != 0xFF or data[1] != 0xD8 or b"\xff\xd9" not in data[-4096:].tobytes():
        return False
    at = 2
    while at + 4 <= size:
        if data[at] != 0xFF:
            return False
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        length = (data[at + 2] << 8) | data[at + 3]
        if marker in _SOF:
            if at + 10 > size or length < 8:
                return False
            height, width = (data[at + 5] << 8) | data[at + 6], (data[at + 7] << 8) | data[at + 8]
            return 0 < height * width <= MAX_PIXELS and data[at + 9] in (1, 3, 4)
        if marker in (0xD9, 0xDA) or length < 2:  # image data or end before any frame header
            return False
        at += 2 + length
    return False


def scan_bytes(data: bytes | memoryview | np.ndarray, formats: set[str] = DALI_FORMATS) -> str | None:
    """None if the encoded file `data` looks decodable (see above), else the reason."""
    data = memoryview(data).cast("B")
    if not len(data):
        return "zero-byte file"
    if "JPEG" in formats and _plain_jpeg(data):
        return None
    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt, pixels = image.format or "?", image.width * image.height
        if fmt not in formats:
            return f"{fmt} is not decoded by this backend"
        if pixels > MAX_PIXELS:
            return f"larger than {MAX_PIXELS} pixels"
        marker = _END_MARKERS.get(fmt)
        if marker is not None and marker not in data[-4096:].tobytes():
            return f"truncated {fmt} (no end marker)"
    except UnidentifiedImageError:  # its message names the BytesIO object, not the file
        return "not an image format PIL knows"
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return f"{type(exc).__name__}: {exc}"
    except Image.DecompressionBombWarning as exc:  # only when warnings are errors
        return str(exc)
    return None


def scan_file(path: str, formats: set[str] = DALI_FORMATS) -> str | None:
    """scan_bytes of the file at `path`."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    return scan_bytes(data, formats)


class MixupCounts(Protocol):
    """What the LightningModule tells about samples mixup had to leave out of a batch a bad file left odd."""

    def mixup_counts(self) -> dict[str, int]: ...


class BadImageReport(L.Callback):
    """The files skipped under data.on_bad_image=skip, over all ranks, into report.json. Put before
    ReportCallback in the callback list, so the count is in the row it writes."""

    def __init__(self, report: ReportCallback, bad_images: BadImageLog) -> None:
        self.report = report
        self.bad_images = bad_images  # this rank's log (the data module's)
        self.files: dict[str, str] = {}
        # Samples mixup dropped to even a batch a bad file left odd, and batches of one it could not mix
        # (module._mix), summed over ranks. Earlier processes of a resumed run count from the checkpoint,
        # as of its last epoch end or validation.
        self.mixup: dict[str, int] = {}
        self._mixup_before: dict[str, int] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.bad_images.files.update(self.files)  # a resumed run does not warn again about files it already reported

    def _collect(self, pl_module: MixupCounts) -> None:
        totals = dict(self._mixup_before)
        for files, rank_counts in gather_objects((dict(self.bad_images.files), pl_module.mixup_counts())):
            self.files.update(files)
            for key, value in rank_counts.items():
                totals[key] = totals.get(key, 0) + value
        self.mixup = {k: v for k, v in totals.items() if v}
        if self.files or self.mixup or "bad_images" in self.report.extra:
            self.report.extra["bad_images"] = {
                "count": len(self.files), "files": dict(sorted(self.files.items())), **self.mixup
            }

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._collect(pl_module)  # type: ignore[arg-type]

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._collect(pl_module)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        return {"files": self.files, "mixup": self.mixup}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.files = dict(state_dict.get("files", {}))
        self.mixup = self._mixup_before = dict(state_dict.get("mixup", {}))
