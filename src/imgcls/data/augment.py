"""The augmentation policy of a recipe (data.augment: autoaugment | randaugment) as timm's policy strings,
and the RandAugment string's magnitude, which progressive resizing ramps and DALI's pipeline reads."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from imgcls.config.choices import AUTOAUGMENT_OPS
from imgcls.errors import ConfigError

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema

# NVIDIA's AutoAugment translates by up to 250 px whatever the image size (PYT IC/autoaugment.py:75
# linspace(0, 250, 11); TF2 dataloader/augment.py:757 translate_const=250; DALI's default max_translate_abs), and
# fills with grey 128 (PYT autoaugment.py:70, TF2 augment.py:812, DALI fill_value). Their v0 has no Cutout, so
# TF2's cutout_const (100) has nothing to act on.
AUTOAUGMENT_TRANSLATE_PIXELS = 250
AUTOAUGMENT_FILL = (128, 128, 128)


def augment_policy(cfg: DataSchema) -> str | None:
    """timm's policy string for data.augment: the AutoAugment policy name, or the RandAugment string."""
    if cfg.augment is None:
        return None
    if cfg.augment == "randaugment":
        return str(cfg.randaugment)
    return str(cfg.autoaugment_policy)


def _lut(img: Image.Image, table: list[int]) -> Image.Image:
    return img.point(table * len(img.getbands()))


def tf2_posterize_bits(level: float, _hparams: Any = None) -> tuple[int]:
    """TF2 augment.py:620-621, 688 `_mult_to_arg(level, 4)`: int(level / 10 x 4) bits (v0's level 2: 0)."""
    return (int(level / 10 * 4),)


def tf2_posterize(img: Image.Image, bits: int, **_: Any) -> Image.Image:
    """TF2 augment.py:374-377: `left_shift(right_shift(image, 8 - bits), 8 - bits)` on uint8. TensorFlow's shift
    kernels clamp the shift into [0, 7] (tensorflow/core/kernels/cwise_ops.h, `left_shift_op` / `right_shift_op`,
    "Avoids UB: don't shift by larger than the bitwidth of T"), so 0 bits shifts by 7 and keeps the top bit:
    [0, 1, 100, 127, 128, 200, 255] -> [0, 0, 0, 0, 128, 128, 128], not a black image."""
    shift = min(max(8 - int(bits), 0), 7)
    return _lut(img, [(i >> shift) << shift for i in range(256)])


def tf2_solarize_threshold(level: float, _hparams: Any = None) -> tuple[int]:
    """TF2 augment.py:689 `_mult_to_arg(level, 256)`: int(level / 10 x 256), 256 at level 10."""
    return (int(level / 10 * 256),)


def tf2_solarize(img: Image.Image, threshold: int, **_: Any) -> Image.Image:
    """TF2 augment.py:326-330 `tf.where(image < threshold, image, 255 - image)`: the Python int threshold becomes a
    uint8 tensor like the image, wrapping modulo 256 (in NVIDIA's tf.data graph, tensor_util.make_tensor_proto's
    np.array(256, np.uint8) = 0 under TF 2.6's NumPy 1.x; eagerly, an int64 tensor cast to uint8). Level 10's 256
    compares with 0: every pixel is inverted."""
    wrapped = int(threshold) % 256
    return _lut(img, [i if i < wrapped else 255 - i for i in range(256)])


def pytorch_posterize_bits(level: float, _hparams: Any = None) -> tuple[int]:
    """PYT image_classification/autoaugment.py:78 `np.round(np.linspace(0, 4, 11))[level]` (v0's level 2: 1 bit)."""
    return (int(np.round(level / 10 * 4)),)


def pytorch_posterize(img: Image.Image, bits: int, **_: Any) -> Image.Image:
    """PYT autoaugment.py:121 `ImageOps.posterize(img, bits)`: PIL's table i & ~(2^(8 - bits) - 1), so 0 bits
    (levels 0 and 1, which v0 does not use) is black, as the Pillow of NVIDIA's container ran it (the Pillow here
    refuses 0 bits)."""
    mask = 0xFF ^ ((1 << (8 - min(max(int(bits), 0), 8))) - 1)
    return _lut(img, [i & mask for i in range(256)])


def pytorch_solarize_threshold(level: float, _hparams: Any = None) -> tuple[float]:
    """PYT autoaugment.py:79 `np.linspace(0, 256, 11)[level]`: level x 25.6, not truncated (76.8 at level 3)."""
    return (level / 10 * 256,)


def pytorch_solarize(img: Image.Image, threshold: float, **_: Any) -> Image.Image:
    """PYT autoaugment.py:122 `ImageOps.solarize(img, threshold)`: pixels below the float threshold stay, so 76 stays
    at level 3 (TF inverts it) and level 10's 256 leaves the image as it is (TF inverts all of it)."""
    return _lut(img, [i if i < threshold else 255 - i for i in range(256)])


def with_nvidia_ops(autoaugment: Any, ops: str) -> Any:
    """timm's AutoAugment with Posterize, Solarize and ShearX/Y run as NVIDIA's code named by `ops` runs them
    (AUTOAUGMENT_OPS). The other v0 ops are timm's PIL ops, which NVIDIA PyTorch's are too, at the same levels."""
    if ops not in AUTOAUGMENT_OPS:
        raise ValueError(f"autoaugment ops {ops!r} is not one of {AUTOAUGMENT_OPS}")
    tf2 = ops == "tf2"
    replacements = {
        "Posterize": (tf2_posterize, tf2_posterize_bits) if tf2 else (pytorch_posterize, pytorch_posterize_bits),
        "Solarize": (tf2_solarize, tf2_solarize_threshold) if tf2 else (pytorch_solarize, pytorch_solarize_threshold),
    }
    for sub_policy in autoaugment.policy:
        for op in sub_policy:
            if op.name in replacements:
                op.aug_fn, op.level_fn = replacements[op.name]
            elif op.name in ("ShearX", "ShearY") and not tf2:
                # PYT autoaugment.py:107-112 shears with Image.BICUBIC; its Rotate and Translate keep PIL's NEAREST
                op.kwargs = {**op.kwargs, "resample": Image.Resampling.BICUBIC}
    return autoaugment


def autoaugment_hparams(image_size: int, interpolation: Any) -> dict[str, Any]:
    """timm AutoAugment hyperparameters for NVIDIA's translation and fill. timm's v0 translates relative to the
    image (TranslateYRel, translate_pct) where NVIDIA's is absolute: on the square crop it sees, 250 px is
    250 / image_size of it. translate_const serves the policies with absolute translations (original)."""
    return {
        "translate_const": AUTOAUGMENT_TRANSLATE_PIXELS,
        "translate_pct": AUTOAUGMENT_TRANSLATE_PIXELS / int(image_size),
        "img_mean": AUTOAUGMENT_FILL,
        "interpolation": interpolation,
    }


def parse_randaugment(policy: str) -> tuple[int, int]:
    """timm's 'rand-m9-n2-mstd0.5' -> (n=2, m=9) (timm's defaults n=2, m=10 when absent)."""
    parts = str(policy).split("-")
    if parts[0] != "rand":
        raise ConfigError(f"data.randaugment={policy} is not a timm RandAugment string like rand-m9-mstd0.5")
    n, m = 2, 10
    for part in parts[1:]:
        match = re.fullmatch(r"([a-z]+)([\d.]+)", part)
        if match and match.group(1) == "m":
            m = int(round(float(match.group(2))))
        elif match and match.group(1) == "n":
            n = int(match.group(2))
    return n, m


def with_magnitude(policy: str, magnitude: int) -> str:
    """timm's 'rand-m9-mstd0.5' with its magnitude replaced (the torchvision backend's augmentation ramp)."""
    parts = [p for p in str(policy).split("-") if not re.fullmatch(r"m[\d.]+", p)]
    return "-".join([parts[0], f"m{int(magnitude)}", *parts[1:]])
