"""NVIDIA's AutoAugment v0 as a DALI policy: the sub-policies of DALI's `image_net` policy (v0 itself,
TF2/dataloader/augment.py:863-889, PYT/image_classification/autoaugment.py:13-41) with the ops of the code that
data.autoaugment_ops names where DALI's differ (data/augment.py runs the same rules on the torchvision backend).

tf2, NVIDIA TF2's augment.py as TensorFlow executes it:
- Posterize keeps int(level / 10 x 4) bits (augment.py:620-621, 688) by shifting right, then left, by 8 - bits
  (:374-377); TensorFlow clamps a shift to 7 (tensorflow/core/kernels/cwise_ops.h, right_shift_op/left_shift_op), so
  v0's ('Posterize', 0.8, 2), 0 bits, keeps the top bit. DALI rounds the level (1 bit kept too, but 2 bits at level 4
  where TF keeps 1).
- Solarize inverts pixels >= int(level / 10 x 256) (augment.py:326-330, 689), a threshold converted to uint8: 256
  (level 10) wraps to 0 and every pixel is inverted. DALI compares with the unrounded threshold (76.8 for level 3:
  a pixel of exactly 76 stays in DALI and is inverted in TF) and leaves level 10's image as it is.
- Rotate, ShearX/Y and TranslateY sample the nearest pixel (augment.py:178-181 interpolation='nearest');
  DALI's default is linear.
pytorch, NVIDIA PyTorch's autoaugment.py (PIL):
- Posterize keeps round(level / 10 x 4) bits (:78, 121), 0 bits black; Solarize inverts pixels >= level x 25.6
  unrounded (:79, 122; level 10 changes nothing), which DALI's own solarize does.
- Shear is bicubic (:107-112), which DALI's warp_affine cannot do (only nearest and linear): linear here, the
  nearest of the two (tests/test_autoaugment_ops.py measures it against PIL's bicubic). Rotate and Translate
  sample the nearest pixel (PIL's default, :89-92, 113-118).
The fill of the warps stays grey 128, NVIDIA PyTorch's (:70) and what TF2's wrap/unwrap mean to do
(augment.py:534-577, :812); see docs/fidelity.md ("AutoAugment fill") for what Keras' transform really fills with.
The other ops take DALI's own (Equalize: OpenCV's lookup table, within a few levels of PIL's/TF's; Color: DALI's
saturation): tests/test_autoaugment_backends.py measures every sub-policy against TF's ops.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
from nvidia.dali import fn
from nvidia.dali.auto_aug import augmentations as a
from nvidia.dali.auto_aug.auto_augment import apply_auto_augment, get_image_net_policy
from nvidia.dali.auto_aug.core import Policy, augmentation
from nvidia.dali.types import DALIInterpType

from imgcls.config.choices import AUTOAUGMENT_OPS

TF_FILL = 128  # TF2 augment.py:812 replace_value [128] * 3; PYT autoaugment.py:70 fillcolor (128, 128, 128)


def tf2_posterize_mask(magnitude: float) -> np.ndarray:
    """The bit mask of TF's shift right then left by 8 - int(magnitude), the shift clamped into [0, 7] as
    TensorFlow's kernels do: 0 bits -> 0x80."""
    shift = min(max(8 - int(magnitude), 0), 7)
    return np.array((0xFF >> shift) << shift, dtype=np.uint8)


def tf2_solarize_threshold(magnitude: float) -> np.ndarray:
    """int(level / 10 x 256) as TF converts it to the uint8 image's type: 256 wraps to 0 (everything inverted)."""
    return np.array(int(magnitude) % 256, dtype=np.int32)


def pytorch_posterize_mask(magnitude: float) -> np.ndarray:
    """PIL's posterize table for round(magnitude) bits (PYT autoaugment.py:78): 0 bits -> 0, a black image."""
    bits = min(max(int(np.round(magnitude)), 0), 8)
    return np.array(0xFF ^ ((1 << (8 - bits)) - 1), dtype=np.uint8)


def pytorch_solarize_threshold(magnitude: float) -> np.ndarray:
    """PYT autoaugment.py:79, 122: PIL keeps the pixels below the unrounded threshold (76.8 at level 3)."""
    return np.array(magnitude, dtype=np.float32)


@augmentation(mag_range=(0, 0.3), randomly_negate=True, mag_to_param=a.warp_x_param, name="linear_shear_x")
def linear_shear_x(data: Any, shear: Any, fill_value: int = TF_FILL) -> Any:
    """DALI's shear_x with linear interpolation whatever interp_type the other warps get."""
    matrix = fn.transforms.shear(shear=shear)
    return fn.warp_affine(
        data, matrix=matrix, fill_value=fill_value, interp_type=DALIInterpType.INTERP_LINEAR, inverse_map=False
    )


@augmentation(mag_range=(0, 0.3), randomly_negate=True, mag_to_param=a.warp_y_param, name="linear_shear_y")
def linear_shear_y(data: Any, shear: Any, fill_value: int = TF_FILL) -> Any:
    """DALI's shear_y with linear interpolation whatever interp_type the other warps get."""
    matrix = fn.transforms.shear(shear=shear)
    return fn.warp_affine(
        data, matrix=matrix, fill_value=fill_value, interp_type=DALIInterpType.INTERP_LINEAR, inverse_map=False
    )


SWAPS: dict[str, dict[str, Any]] = {
    "tf2": {
        "posterize": a.posterize.augmentation(mag_range=(0, 4), mag_to_param=tf2_posterize_mask, name="tf2_posterize"),
        "solarize": a.solarize.augmentation(
            mag_range=(0, 256), mag_to_param=tf2_solarize_threshold, name="tf2_solarize"
        ),
    },
    "pytorch": {
        "posterize": a.posterize.augmentation(
            mag_range=(0, 4), mag_to_param=pytorch_posterize_mask, name="pytorch_posterize"
        ),
        "solarize": a.solarize.augmentation(
            mag_range=(0, 256), mag_to_param=pytorch_solarize_threshold, name="pytorch_solarize"
        ),
        "shear_x": linear_shear_x,
        "shear_y": linear_shear_y,
    },
}


def v0_policy(max_translate_abs: int, ops: str) -> Policy:
    """DALI's image_net (v0) policy with the Posterize, Solarize and Shear of `ops` (AUTOAUGMENT_OPS); the
    0-probability ops of NVIDIA's v0 are already left out there, which changes nothing."""
    if ops not in AUTOAUGMENT_OPS:
        raise ValueError(f"autoaugment ops {ops!r} is not one of {AUTOAUGMENT_OPS}")
    dali = get_image_net_policy(max_translate_abs=max_translate_abs)
    swap = SWAPS[ops]
    sub_policies = [[(swap.get(aug.name, aug), p, mag) for aug, p, mag in sub] for sub in dali.sub_policies]
    return Policy(name=f"{ops}_v0", num_magnitude_bins=dali.num_magnitude_bins, sub_policies=sub_policies)


def nvidia_auto_augment(images: Any, policy: Policy) -> Any:
    """Apply `policy` (v0_policy) with NVIDIA's warps: grey fill, nearest pixel (but a linear_shear_*)."""
    offered: dict[str, Any] = {"fill_value": TF_FILL, "interp_type": DALIInterpType.INTERP_NN}
    # DALI refuses an argument no op of the policy takes
    taken = {name for aug in policy.augmentations.values() for name in inspect.signature(aug.op).parameters}
    return apply_auto_augment(policy, images, **{k: v for k, v in offered.items() if k in taken})
