"""TensorFlow's sample_distorted_bounding_box kernel transcribed line by line, one attempt at a time, as the
oracle for imgcls.data.tf_crop.sample_windows (which runs every attempt of a batch at once): the C++ at
tensorflow/tensorflow 27b00cb6, tensorflow/core/kernels/image/sample_distorted_bounding_box_op.cc
(GenerateRandomCrop, SatisfiesOverlapConstraints, DoCompute's attempt loop and whole-image fallback), in float32
where it is float and double where it is double."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from imgcls.data.tf_crop import DistortedCrop

F32 = np.float32
K_EPS = 0.0000001  # GenerateRandomCrop's kEps


def _lrintf(value: Any) -> int:
    return int(np.rint(F32(value)))  # C's lrintf under the default rounding mode: half to even


def _uniform_int(u: float, n: int) -> int:
    """TF's SimplePhilox::Uniform(n), a uniform integer in [0, n), from u in [0, 1)."""
    return min(int(u * n), n - 1)


def _random_crop(
    width: int, height: int, spec: DistortedCrop, aspect: np.float32, u_height: float, u_y: float, u_x: float
) -> tuple[int, int, int, int] | None:
    """GenerateRandomCrop: (x0, y0, x1, y1), or None where TF returns false."""
    min_area = F32(spec.area_range[0]) * F32(width) * F32(height)
    max_area = F32(spec.area_range[1]) * F32(width) * F32(height)
    crop_h = _lrintf(np.sqrt(min_area / aspect, dtype=F32))
    max_h = _lrintf(np.sqrt(max_area / aspect, dtype=F32))
    if _lrintf(F32(max_h) * aspect) > width:
        max_h = int((width + 0.5 - float(F32(K_EPS))) / float(aspect))  # in double, as C++ promotes it
        if _lrintf(F32(max_h) * aspect) > width:
            max_h -= 1
    max_h = min(max_h, height)
    crop_h = min(crop_h, max_h)
    if crop_h < max_h:
        crop_h += _uniform_int(u_height, max_h - crop_h + 1)
    crop_w = _lrintf(F32(crop_h) * aspect)
    area = F32(crop_w * crop_h)
    if area < min_area:
        crop_h += 1
        crop_w = _lrintf(F32(crop_h) * aspect)
        area = F32(crop_w * crop_h)
    if area > max_area:
        crop_h -= 1
        crop_w = _lrintf(F32(crop_h) * aspect)
        area = F32(crop_w * crop_h)
    if area < min_area or area > max_area or crop_w > width or crop_h > height or crop_w <= 0 or crop_h <= 0:
        return None
    # Uniform(n) is in [0, n): like TF, a crop narrower than the image never touches its right or bottom edge.
    y = _uniform_int(u_y, height - crop_h) if crop_h < height else 0
    x = _uniform_int(u_x, width - crop_w) if crop_w < width else 0
    return x, y, x + crop_w, y + crop_h


def _area(x0: int, y0: int, x1: int, y1: int) -> np.float32:
    return F32((x1 - x0) * (y1 - y0))


def _covers(crop: tuple[int, int, int, int], boxes: Sequence[tuple[int, int, int, int]], minimum: float) -> bool:
    """SatisfiesOverlapConstraints: the crop covers at least `minimum` of one box's area."""
    if _area(*crop) < 1:
        return False
    for box in boxes:
        box_area = _area(*box)
        if box_area < 1:  # a box without pixels counts for nothing
            continue
        x0, y0 = max(crop[0], box[0]), max(crop[1], box[1])
        x1, y1 = min(crop[2], box[2]), min(crop[3], box[3])
        inter = F32(0) if x0 > x1 or y0 > y1 else _area(x0, y0, x1, y1)
        if inter / box_area >= F32(minimum):
            return True
    return False


def pixel_boxes(boxes: np.ndarray | None, height: int, width: int) -> list[tuple[int, int, int, int]]:
    """Object boxes [ymin, xmin, ymax, xmax] relative to the image -> TF's integer pixel boxes (x0, y0, x1, y1):
    static_cast<int32>(coordinate x size). TF refuses coordinates outside [0, 1]; they are clipped here, so a
    record with a slightly wrong box still trains. No box: the whole image (use_image_if_no_bounding_boxes)."""
    if boxes is None or np.size(boxes) == 0:
        return [(0, 0, width, height)]
    rel = np.clip(np.asarray(boxes, F32).reshape(-1, 4), 0, 1)
    w, h = F32(width), F32(height)
    return [(int(b[1] * w), int(b[0] * h), int(b[3] * w), int(b[2] * h)) for b in rel]


def reference_window(
    height: int, width: int, spec: DistortedCrop, uniforms: np.ndarray, boxes: np.ndarray | None = None
) -> tuple[int, int, int, int]:
    """(y, x, h, w) of TF's crop of a height x width image. `uniforms`: (spec.max_attempts, 4) numbers in [0, 1)
    (aspect, height, y, x per attempt); `boxes`: object boxes [ymin, xmin, ymax, xmax] in [0, 1], or None."""
    pixel = pixel_boxes(boxes, height, width)
    lo, hi = F32(spec.aspect_range[0]), F32(spec.aspect_range[1])
    for attempt in range(spec.max_attempts):
        u_aspect, u_height, u_y, u_x = (float(v) for v in uniforms[attempt])
        aspect = F32(u_aspect) * (hi - lo) + lo
        crop = _random_crop(width, height, spec, aspect, u_height, u_y, u_x)
        if crop is not None and _covers(crop, pixel, spec.min_object_covered):
            x0, y0, x1, y1 = crop
            return y0, x0, y1 - y0, x1 - x0
    return 0, 0, height, width  # no attempt succeeded: the whole image
