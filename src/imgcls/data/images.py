"""Image decoding that survives real-world files: the torchvision backend's loader and dataset.

Decodable files of any mode become 8-bit RGB (CMYK, grayscale, palette/GIF, RGBA, 16-bit PNG; the file's
content decides the format, not its name). A file that is not completely decodable is a bad image
(bad_images.py): the dataset returns a BadSample for it instead of raising.
"""

from __future__ import annotations

import warnings
from typing import IO, Any

import numpy as np
from PIL import Image
from torchvision.datasets import ImageFolder, VisionDataset

from imgcls.data.bad_images import BadImage, BadSample, max_pixels
from imgcls.data.file_list import FileList
from imgcls.seeding import seeded


def load_rgb(path: str | IO[bytes]) -> Image.Image:
    """Decode the whole file (so truncation is detected now, not in a transform) into 8-bit RGB. `path`: a file's
    path, or a file object (a shard's record in memory)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                if image.width * image.height > max_pixels():
                    raise BadImage(
                        f"{image.width}x{image.height} is larger than data.max_image_pixels={max_pixels()} pixels"
                    )
                image.load()
                return to_rgb(image)
    except BadImage:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadImage(f"{type(exc).__name__}: {exc}") from None


def to_rgb(image: Image.Image) -> Image.Image:
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16-bit grayscale: PIL's convert("RGB") clips at 255 (a white image); scale to 8 bits instead.
        image = _scaled_to_8_bits(image)
    elif image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # PIL asks for this before dropping palette transparency
    return image.convert("RGB")  # RGBA: alpha dropped (as torchvision's loader); CMYK/L/LA/P: converted


# Pixels scaled at a time: the temporaries stay at a few MB whatever the image's size, where whole-image float64
# arrays cost 8 bytes a pixel several times over.
_ROWS_PIXELS = 1 << 20


def _scaled_to_8_bits(image: Image.Image) -> Image.Image:
    """Mode L of a 16-bit (I;16*) or 32-bit integer (I) grayscale image: round(v * 255 / peak), clipped to
    0..255, in integers. peak is 65535, or 255 for an I image whose values all fit 8 bits."""
    # getextrema's stubs allow a per-band tuple; a single-band image's maximum is a number.
    peak = 65535 if image.mode.startswith("I;16") or image.getextrema()[1] > 255 else 255  # type: ignore[operator]
    width, height = image.size
    scaled = np.empty((height, width), np.uint8)
    rows = max(1, _ROWS_PIXELS // max(width, 1))
    for top in range(0, height, rows):
        block = np.asarray(image.crop((0, top, width, min(top + rows, height))), dtype=np.int64)
        np.clip(block, 0, peak, out=block)
        # floor(v * 255 / peak + 1/2) exactly: the float64 formula's values, without its rounding error.
        block *= 2 * 255
        block += peak
        block //= 2 * peak
        scaled[top : top + rows] = block
    return Image.fromarray(scaled, "L")


class CheckedImageFolder(ImageFolder):
    """ImageFolder whose __getitem__ returns a BadSample for an undecodable file instead of raising.

    `files`: the split's files already listed (file_list.FileList, the same walk and order as ImageFolder's),
    instead of a walk of its own: under DDP one rank walks and the others receive the list (the backend), and
    the list is compact (a few bytes a file) where ImageFolder's `samples` keep a Python tuple per file, which
    every DataLoader worker process touches and so copies (ImageNet: ~280 MB per process)."""

    def __init__(self, root: str, transform: Any, files: FileList | None = None) -> None:
        self.files = files
        if files is None:
            super().__init__(root, transform=transform, loader=load_rgb)
            return
        VisionDataset.__init__(self, root, transform=transform)
        self.loader = load_rgb
        self.classes = list(files.classes)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    def __len__(self) -> int:
        return len(self.files) if self.files is not None else len(self.samples)

    def _sample(self, index: int) -> tuple[str, int]:
        if self.files is None:
            return self.samples[index]
        return self.files.path(index), self.files.label(index)

    def __getitem__(self, index: int | tuple[int, int]) -> Any:
        seed = None
        if isinstance(index, tuple):  # (index, augmentation seed) from RankSampler(per_sample_seeds=True)
            index, seed = index
        path, target = self._sample(index)
        try:
            image = self.loader(path)
        except BadImage as exc:
            return BadSample(path, str(exc))
        if seed is None:
            return self.transform(image), target
        with seeded(seed):
            return self.transform(image), target
