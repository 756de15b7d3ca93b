"""NVIDIA TF2's AutoAugment v0 as a DALI policy: the sub-policies of DALI's `image_net` policy (v0 itself,
TF2/dataloader/augment.py:863-889) with TF's magnitude-to-parameter rules where DALI's differ.

- Posterize keeps int(level / 10 x 4) bits (augment.py:620-621, 688) by shifting (:374-377): v0's
  ('Posterize', 0.8, 2) keeps 0 bits, a black image. DALI rounds the level (1 bit kept).
- Solarize inverts pixels >= int(level / 10 x 256) (augment.py:326-330, 689): DALI compares with the unrounded
  threshold (76.8 for level 3), so a pixel of exactly int(threshold) stays in DALI and is inverted in TF.
- Rotate, ShearX/Y and TranslateY sample the nearest pixel (augment.py:178-181 interpolation='nearest');
  DALI's default is linear.
The fill of those four ops stays grey 128, what TF2's wrap/unwrap mean to do (augment.py:534-577, :812); see
docs/fidelity.md ("AutoAugment fill") for what Keras' transform really fills with and why imgcls keeps grey.
The other ops take DALI's own (Equalize: OpenCV's lookup table, within a few levels of PIL's/TF's; Color: DALI's
saturation): tests/test_autoaugment_backends.py measures every sub-policy against TF's ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nvidia.dali.auto_aug import augmentations as a
from nvidia.dali.auto_aug.auto_augment import apply_auto_augment, get_image_net_policy
from nvidia.dali.auto_aug.core import Policy
from nvidia.dali.types import DALIInterpType

TF_FILL = 128  # TF2 augment.py:812 replace_value [128] * 3


def tf_posterize_mask(magnitude: float) -> np.ndarray:
    """The bit mask keeping int(magnitude) high bits (TF's shift right then left by 8 - bits): 0 bits -> 0."""
    bits = int(magnitude)
    return np.array(0xFF ^ ((1 << (8 - bits)) - 1), dtype=np.uint8)


def tf_solarize_threshold(magnitude: float) -> np.ndarray:
    return np.array(int(magnitude), dtype=np.int32)  # int(level / 10 x 256), compared with the uint8 pixels


TF_POSTERIZE = a.posterize.augmentation(mag_range=(0, 4), mag_to_param=tf_posterize_mask, name="tf_posterize")
TF_SOLARIZE = a.solarize.augmentation(mag_range=(0, 256), mag_to_param=tf_solarize_threshold, name="tf_solarize")


def tf_v0_policy(max_translate_abs: int) -> Policy:
    """DALI's image_net (v0) policy with TF's Posterize and Solarize (the 0-probability ops of TF's v0 are already
    left out there, which changes nothing)."""
    dali = get_image_net_policy(max_translate_abs=max_translate_abs)
    swap = {"posterize": TF_POSTERIZE, "solarize": TF_SOLARIZE}
    sub_policies = [[(swap.get(aug.name, aug), p, mag) for aug, p, mag in sub] for sub in dali.sub_policies]
    return Policy(name="TF2AutoAugmentV0", num_magnitude_bins=dali.num_magnitude_bins, sub_policies=sub_policies)


WARPS = frozenset({"rotate", "shear_x", "shear_y", "translate_x", "translate_y"})  # what takes fill and interp


def tf_auto_augment(images: Any, policy: Policy) -> Any:
    """Apply `policy` (tf_v0_policy) as TF2 does: nearest-pixel geometric ops, grey fill."""
    warps = any(name in WARPS for name in policy.augmentations)  # DALI refuses arguments no op takes
    kwargs: dict[str, Any] = {"fill_value": TF_FILL, "interp_type": DALIInterpType.INTERP_NN} if warps else {}
    return apply_auto_augment(policy, images, **kwargs)
