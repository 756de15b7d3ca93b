"""The structural scan of an encoded image file, for the backends that cannot skip a file while decoding
(DALI): scan_bytes / scan_file give None for a file that looks decodable, else the reason it is a bad image
(bad_images.py applies the policy). A plain JPEG is walked marker by marker without PIL; anything else asks PIL.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from imgcls.data.bad_images import max_pixels

# DALI's decoder stops the whole pipeline on one undecodable file, and it does not decode GIF. The DALI pipelines
# check each encoded file as the reader hands it over (dali/pipelines.py), before the decoder sees it; a full
# decode would cost as much as the decode itself, so the check is structural: the header must parse (PIL), the
# format must be one DALI decodes, the size must be within data.max_image_pixels, and a JPEG/PNG must end with its end
# marker (a truncated file does not). A file damaged in the middle with intact ends passes the check.
DALI_FORMATS = {"JPEG", "PNG", "TIFF", "BMP", "PPM", "JPEG2000", "WEBP", "MPO"}
_END_MARKERS = {"JPEG": b"\xff\xd9", "MPO": b"\xff\xd9", "PNG": b"IEND\xaeB`\x82"}


# JPEG start-of-frame markers (baseline, extended, progressive, lossless; not DHT/JPG/DAC), whose segment
# holds the height and width; and the markers without a length field.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}


def _plain_jpeg(data: memoryview) -> bool:
    """True for a JPEG with SOI, a frame header of 1, 3 or 4 components within data.max_image_pixels, and an end marker.

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
            return 0 < height * width <= max_pixels() and data[at + 9] in (1, 3, 4)
        if marker in (0xD9, 0xDA) or length < 2:  # image data or end before any frame header
            return False
        at += 2 + length
    return False


def scan_bytes(data: bytes | memoryview | np.ndarray, formats: set[str] = DALI_FORMATS) -> str | None:
    """None if the encoded file `data` looks decodable (see above), else the reason."""
    # An array through its .data memoryview: numpy's stubs do not declare the buffer protocol.
    data = memoryview(data.data if isinstance(data, np.ndarray) else data).cast("B")
    if not len(data):
        return "zero-byte file"
    if "JPEG" in formats and _plain_jpeg(data):
        return None
    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt, pixels = image.format or "?", image.width * image.height
        if fmt not in formats:
            return f"{fmt} is not decoded by this backend"
        if pixels > max_pixels():
            return f"larger than data.max_image_pixels={max_pixels()} pixels"
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
