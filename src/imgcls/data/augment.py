"""The augmentation policy of a recipe (data.augment: autoaugment | randaugment) as timm's policy strings,
and the RandAugment string's magnitude, which progressive resizing ramps and DALI's pipeline reads."""

from __future__ import annotations

import re
from typing import Any

from imgcls.errors import ConfigError

# Our recipe names -> timm auto_augment policy strings.
# "original" is the AutoAugment paper's ImageNet policy, the one NVIDIA's IC/autoaugment.py implements.
AUGMENT_POLICIES = {"autoaugment": "original", "randaugment": None}


def augment_policy(cfg: Any) -> str | None:
    if cfg.augment is None:
        return None
    if cfg.augment == "randaugment":
        return str(cfg.randaugment)
    return AUGMENT_POLICIES[cfg.augment]


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
