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
from typing import TYPE_CHECKING, Any

import numpy as np
from timm.data.transforms import RandomResizedCropAndInterpolation

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema

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


def crop_spec(cfg: DataSchema) -> DistortedCrop:
    """The DistortedCrop of a data config (data.train_crop_scale, _ratio, _min_object_covered, _attempts)."""
    return DistortedCrop(
        area_range=(float(cfg.train_crop_scale[0]), float(cfg.train_crop_scale[1])),
        aspect_range=(float(cfg.train_crop_ratio[0]), float(cfg.train_crop_ratio[1])),
        min_object_covered=float(cfg.train_crop_min_object_covered),
        max_attempts=int(cfg.train_crop_attempts),
    )


def uses_object_boxes(cfg: DataSchema) -> bool:
    """Whether a data config's train crop covers the records' object boxes (TF1: data.train_crop=tf with
    data.train_crop_object_boxes) rather than the whole image."""
    return cfg.train_crop == "tf" and cfg.train_crop_object_boxes


def _rint(values: np.ndarray) -> np.ndarray:
    return np.rint(values).astype(np.int64)  # C's lrintf under the default rounding mode: half to even


def _uniform_int(u: np.ndarray, n: np.ndarray) -> np.ndarray:
    """TF's SimplePhilox::Uniform(n), a uniform integer in [0, n), from u in [0, 1) (in double, as C++)."""
    return np.minimum((u.astype(np.float64) * n).astype(np.int64), n - 1)


def _random_crops(
    width: np.ndarray, height: np.ndarray, spec: DistortedCrop, aspect: np.ndarray, u: np.ndarray
) -> tuple[np.ndarray, ...]:
    """GenerateRandomCrop for every attempt at once: (x0, y0, crop_w, crop_h, valid); width, height (B, 1),
    aspect (B, A) float32, u (B, A, 4). Each float32 step stays float32 and each double step double, as TF's."""
    min_area = F32(spec.area_range[0]) * width.astype(F32) * height.astype(F32)
    max_area = F32(spec.area_range[1]) * width.astype(F32) * height.astype(F32)
    crop_h = _rint(np.sqrt(min_area / aspect))
    max_h = _rint(np.sqrt(max_area / aspect))
    too_wide = _rint(max_h.astype(F32) * aspect) > width
    narrower = ((width + 0.5 - float(F32(K_EPS))) / aspect.astype(np.float64)).astype(np.int64)
    max_h = np.where(too_wide, narrower, max_h)
    max_h -= too_wide & (_rint(max_h.astype(F32) * aspect) > width)
    max_h = np.minimum(max_h, height)
    crop_h = np.minimum(crop_h, max_h)
    crop_h = np.where(crop_h < max_h, crop_h + _uniform_int(u[..., 1], max_h - crop_h + 1), crop_h)

    def widths(crop_h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        crop_w = _rint(crop_h.astype(F32) * aspect)
        return crop_w, (crop_w * crop_h).astype(F32)

    crop_w, area = widths(crop_h)
    crop_h = crop_h + (area < min_area)  # one pixel taller where the rounding fell under the smallest area
    crop_w, area = widths(crop_h)
    crop_h = crop_h - (area > max_area)  # (after the step above, as TF's two ifs)
    crop_w, area = widths(crop_h)
    valid = (area >= min_area) & (area <= max_area) & (crop_w <= width) & (crop_h <= height)
    valid &= (crop_w > 0) & (crop_h > 0)
    # Uniform(n) is in [0, n): like TF, a crop narrower than the image never touches its right or bottom edge.
    y = np.where(crop_h < height, _uniform_int(u[..., 2], np.maximum(height - crop_h, 1)), 0)
    x = np.where(crop_w < width, _uniform_int(u[..., 3], np.maximum(width - crop_w, 1)), 0)
    return x, y, crop_w, crop_h, valid


def _covers(
    x: np.ndarray, y: np.ndarray, crop_w: np.ndarray, crop_h: np.ndarray, boxes: np.ndarray, minimum: float
) -> np.ndarray:
    """SatisfiesOverlapConstraints per attempt: the crop covers at least `minimum` of one box's area; boxes
    (B, K, 4) pixel boxes (x0, y0, x1, y1), padding boxes without pixels (they count for nothing, as in TF)."""
    x0, y0, x1, y1 = (boxes[:, None, :, i] for i in range(4))  # (B, 1, K)
    box_area = ((x1 - x0) * (y1 - y0)).astype(F32)
    cx0, cy0 = x[..., None], y[..., None]  # (B, A, 1)
    cx1, cy1 = cx0 + crop_w[..., None], cy0 + crop_h[..., None]
    ix0, iy0, ix1, iy1 = np.maximum(cx0, x0), np.maximum(cy0, y0), np.minimum(cx1, x1), np.minimum(cy1, y1)
    inter = np.where((ix0 > ix1) | (iy0 > iy1), 0, (ix1 - ix0) * (iy1 - iy0)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        enough = (box_area >= 1) & (inter / box_area >= F32(minimum))
    return ((crop_w * crop_h).astype(F32) >= 1) & enough.any(axis=-1)


def pixel_boxes(boxes: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Object boxes [ymin, xmin, ymax, xmax] relative to the image, (B, K, 4) -> TF's integer pixel boxes
    (x0, y0, x1, y1): static_cast<int32>(coordinate x size); heights, widths (B, 1). TF refuses coordinates
    outside [0, 1]; they are clipped here, so a record with a slightly wrong box still trains."""
    rel = np.clip(np.nan_to_num(boxes.astype(F32)), 0, 1)  # TF refuses NaN; here such a box has no pixels
    w, h = widths.astype(F32), heights.astype(F32)
    return np.stack([rel[..., 1] * w, rel[..., 0] * h, rel[..., 3] * w, rel[..., 2] * h], axis=-1).astype(np.int64)


WHOLE_IMAGE = np.array([[0.0, 0.0, 1.0, 1.0]], F32)  # TF's use_image_if_no_bounding_boxes: (0, 0, width, height)


def padded_boxes(boxes: Sequence[np.ndarray | None]) -> np.ndarray:
    """(B, K, 4) relative boxes from each image's (K_i, 4) boxes or None; None or no box is the whole image, and
    the padding boxes have no pixels (TF counts those for nothing)."""
    per_image = [WHOLE_IMAGE if b is None or np.size(b) == 0 else np.asarray(b, F32).reshape(-1, 4) for b in boxes]
    padded = np.zeros((len(per_image), max(len(b) for b in per_image), 4), F32)
    for i, image_boxes in enumerate(per_image):
        padded[i, : len(image_boxes)] = image_boxes
    return padded


def sample_windows(
    heights: Sequence[int] | np.ndarray,
    widths: Sequence[int] | np.ndarray,
    spec: DistortedCrop,
    uniforms: np.ndarray,
    boxes: np.ndarray | None = None,
) -> np.ndarray:
    """(B, 4) rows (y, x, h, w) of TF's crops of B images, all attempts of all images at once (one call per
    batch: the DALI pipeline's Python step holds the GIL for microseconds an image, not TF's attempt loop).
    `uniforms`: (B, spec.max_attempts, 4) numbers in [0, 1) (aspect, height, y, x per attempt); `boxes`:
    (B, K, 4) object boxes [ymin, xmin, ymax, xmax] in [0, 1] (padded_boxes), None for the whole images."""
    height = np.asarray(heights, np.int64).reshape(-1, 1)
    width = np.asarray(widths, np.int64).reshape(-1, 1)
    u = np.asarray(uniforms).reshape(len(height), -1, UNIFORMS_PER_ATTEMPT)[:, : spec.max_attempts]
    lo, hi = F32(spec.aspect_range[0]), F32(spec.aspect_range[1])
    aspect = u[..., 0].astype(F32) * (hi - lo) + lo
    x, y, crop_w, crop_h, valid = _random_crops(width, height, spec, aspect, u)
    relative = np.broadcast_to(WHOLE_IMAGE, (len(height), 1, 4)) if boxes is None else boxes
    pixel = pixel_boxes(relative, height, width)
    ok = valid & _covers(x, y, crop_w, crop_h, pixel, spec.min_object_covered)
    first = ok.argmax(axis=1)  # TF's first successful attempt
    window = np.stack((y, x, crop_h, crop_w), axis=-1)[np.arange(len(first)), first]
    whole = np.concatenate([np.zeros_like(height), np.zeros_like(height), height, width], axis=1)
    return np.where(ok.any(axis=1)[:, None], window, whole)  # no attempt succeeded: the whole image


def sample_window(
    height: int, width: int, spec: DistortedCrop, uniforms: np.ndarray, boxes: np.ndarray | None = None
) -> tuple[int, int, int, int]:
    """(y, x, h, w) of TF's crop of one height x width image: sample_windows for a batch of one."""
    window = sample_windows([height], [width], spec, np.asarray(uniforms)[None], padded_boxes([boxes]))[0]
    return int(window[0]), int(window[1]), int(window[2]), int(window[3])


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
