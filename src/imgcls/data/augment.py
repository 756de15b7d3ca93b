"""The augmentation policy of a recipe (data.augment: autoaugment | randaugment) as timm's policy strings,
and the RandAugment string's magnitude, which progressive resizing ramps and DALI's pipeline reads."""

from __future__ import annotations

import re
from typing import Any

from PIL import Image, ImageOps

from imgcls.errors import ConfigError

# NVIDIA's AutoAugment translates by up to 250 px whatever the image size (PYT IC/autoaugment.py:75
# linspace(0, 250, 11); TF2 dataloader/augment.py:757 translate_const=250; DALI's default max_translate_abs), and
# fills with grey 128 (PYT autoaugment.py:70, TF2 augment.py:812, DALI fill_value). Their v0 has no Cutout, so
# TF2's cutout_const (100) has nothing to act on.
AUTOAUGMENT_TRANSLATE_PIXELS = 250
AUTOAUGMENT_FILL = (128, 128, 128)


def augment_policy(cfg: Any) -> str | None:
    """timm's policy string for data.augment: the AutoAugment policy name, or the RandAugment string."""
    if cfg.augment is None:
        return None
    if cfg.augment == "randaugment":
        return str(cfg.randaugment)
    policy = cfg.get("autoaugment_policy", "v0")
    return str(policy)


def posterize_keeping(img: Image.Image, bits_to_keep: int, **_: Any) -> Image.Image:
    """TF's posterize (TF2 dataloader/augment.py:374-377: shift right, then left, by 8 - bits): 0 bits kept is a
    black image. v0's ('Posterize', 0.8, 2) keeps int(2 / 10 x 4) = 0 bits (augment.py:620-621, 688); timm hands
    that to PIL, which refuses bits below 1 (ValueError: the training run died on it)."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return img.point([0] * 256 * len(img.getbands()))
    return ImageOps.posterize(img, int(bits_to_keep))


def with_tf_posterize(autoaugment: Any) -> Any:
    """timm's AutoAugment with every Posterize op running posterize_keeping."""
    for sub_policy in autoaugment.policy:
        for op in sub_policy:
            if op.name == "Posterize":
                op.aug_fn = posterize_keeping
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
