"""TensorFlow's training crop, `tf.image.sample_distorted_bounding_box`, for both data backends.

NVIDIA's TF1 and TF2 ConvNets crop with it (min_object_covered 0.1, aspect_ratio_range [0.75, 1.33], area_range
[0.05, 1.0], max_attempts 100, use_image_if_no_bounding_boxes; TF1/utils/image_processing.py:52-61 with the
records' ImageNet object boxes, TF2/dataloader/preprocessing.py:227-237 with the whole image as the box). Its
sampler is not torchvision's RandomResizedCrop: per attempt TF draws the aspect uniformly (not log-uniformly)
and then the crop's *height* as a uniform integer between the heights of the smallest and largest allowed
areas (so the area is not uniform), and accepts the attempt only if the crop covers at least
min_object_covered of one object box's area; after max_attempts misses it returns the whole image. With the
whole image as the box this rejects every crop under 10 % of the image, so area_range's 5 % is never reached.

`sample_window` is TF's kernel (tensorflow/core/kernels/image/sample_distorted_bounding_box_op.cc at
tensorflow/tensorflow 27b00cb6: GenerateRandomCrop, SatisfiesOverlapConstraints, and DoCompute's attempt loop
and whole-image fallback) step by step in float32, with the random numbers passed in: TF's
RandFloat is u, its Uniform(n) is floor(u * n). The torchvision backend draws them from Python's `random`
(seeded per worker, as timm's crop), the DALI backend from `fn.random.uniform` (seeded and checkpointed with
the pipeline, data/dali/pipelines.py).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from timm.data.transforms import RandomResizedCropAndInterpolation

F32 = np.float32
UNIFORMS_PER_ATTEMPT = 4  # aspect, height, y offset, x offset
K_EPS = 0.0000001  # GenerateRandomCrop's kEps


@dataclass(frozen=True)
class DistortedCrop:
    """The arguments of sample_distorted_bounding_box that NVIDIA passes (TF2 preprocessing.py:230-237)."""

    area_range: tuple[float, float] = (0.05, 1.0)
    aspect_range: tuple[float, float] = (0.75, 1.33)
    min_object_covered: float = 0.1
    max_attempts: int = 100


def crop_spec(cfg: Any) -> DistortedCrop:
    """The DistortedCrop of a data config (data.train_crop_scale, _ratio, _min_object_covered, _attempts)."""
    return DistortedCrop(
        area_range=(float(cfg.train_crop_scale[0]), float(cfg.train_crop_scale[1])),
        aspect_range=(float(cfg.train_crop_ratio[0]), float(cfg.train_crop_ratio[1])),
        min_object_covered=float(cfg.train_crop_min_object_covered),
        max_attempts=int(cfg.train_crop_attempts),
    )


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


def sample_window(
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


OBJECT_BOXES_INFO = "imgcls_object_boxes"  # a PIL image's info key for its record's object boxes (TF1)


class TFDistortedCrop(RandomResizedCropAndInterpolation):
    """timm's RandomResizedCrop with TF's sample_distorted_bounding_box choosing the window (torchvision
    backend). The object boxes come with the image, in `img.info[OBJECT_BOXES_INFO]` (TF1's records), or the
    whole image is the box (TF2, image folders)."""

    def __init__(self, size: int, spec: DistortedCrop, interpolation: str = "bilinear") -> None:
        super().__init__(size, scale=spec.area_range, ratio=spec.aspect_range, interpolation=interpolation)
        self.spec = spec

    def get_params(self, img: Any, scale: Any = None, ratio: Any = None) -> tuple[int, int, int, int]:  # type: ignore[override]
        width, height = img.size
        draws = self.spec.max_attempts * UNIFORMS_PER_ATTEMPT
        uniforms = np.array([random.random() for _ in range(draws)]).reshape(-1, UNIFORMS_PER_ATTEMPT)
        return sample_window(height, width, self.spec, uniforms, img.info.get(OBJECT_BOXES_INFO))
