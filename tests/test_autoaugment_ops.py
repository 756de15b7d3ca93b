"""AutoAugment's Posterize and Solarize at every level, and Shear, as NVIDIA's code runs them, on both backends.

The TF recipes (data.autoaugment_ops=tf2) run NVIDIA TF2's dataloader/augment.py as TensorFlow executes it; the
PyTorch recipes (pytorch) NVIDIA PyTorch's image_classification/autoaugment.py (PIL). Where the two differ:

- Posterize, TF2 augment.py:374-377 `left_shift(right_shift(image, 8 - bits), 8 - bits)` with bits
  int(level / 10 x 4) (:688): TensorFlow's shift kernels clamp the shift into [0, 7], so 0 bits (levels 0-2) keeps
  the top bit, as 1 bit does. PyTorch autoaugment.py:78 rounds the level (level 2: 1 bit; 0 and 1: 0 bits, black).
- Solarize, TF2 augment.py:326-330 `tf.where(image < threshold, image, 255 - image)` with threshold
  int(level / 10 x 256) (:689), converted to the image's uint8: 256 (level 10) wraps to 0 and inverts every pixel.
  PyTorch autoaugment.py:79, 122: PIL keeps the pixels below level x 25.6, unrounded; level 10 changes nothing.
- Shear: PyTorch autoaugment.py:107-112 resamples bicubically (TF2 and NVIDIA's other warps: the nearest pixel).

TF_TABLE below is what TensorFlow gives at the edge levels, so that the suite needs no TensorFlow; the opt-in test
compares every level with TensorFlow itself (IMGCLS_TF_PYTHON, or tensorflow importable here).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.conftest import compose_config, sample_photos
from tests.test_autoaugment_backends import EXPERIMENT, FILL, pyt_op, tf_posterize, tf_solarize

PIXELS = [0, 1, 75, 76, 77, 100, 127, 128, 200, 255]
INVERTED = [255 - p for p in PIXELS]
# TensorFlow's outputs on PIXELS (uint8) of NVIDIA TF2's posterize/solarize at a level, (op, level): values.
# Posterize shifts by 8 - int(level / 10 x 4). tensorflow/core/kernels/cwise_ops.h, functor::right_shift_op and
# left_shift_op: "Avoids UB: don't shift by larger than the bitwidth of T": `if (y_clamped > sizeof(T) * CHAR_BIT
# - 1) y_clamped = sizeof(T) * CHAR_BIT - 1`, the same in a TF 2.x source of 2020 and today's (the CPU kernel,
# where tf.data runs; tensorflow/tensorflow#57029 shows TF 2.9's CPU kernel clamping a negative shift to 0). Issue
# 41 ran TensorFlow 2.21 (CPU): posterize(x, 0) of [0, 1, 100, 127, 128, 200, 255] = [0, 0, 0, 0, 128, 128, 128].
# Solarize's Python int threshold meets a uint8 image in `image < threshold`: NVIDIA's tf.data graph converts it
# with tensorflow/python/framework/tensor_util.py make_tensor_proto, np.array(256, dtype=np.uint8), 0 under the
# NumPy 1.x of TF 2.6 (nvcr.io/nvidia/tensorflow:21.09-tf2-py3, TF2/Dockerfile:15); eagerly,
# tensorflow/python/lib/core/py_seq_tensor.cc makes an int64 tensor of it and the caller casts it to uint8, 0 too.
# Issue 41 (TF 2.21, CPU): solarize(x, 256) of [0, 1, 100] = [255, 254, 155].
TF_TABLE: dict[tuple[str, int], list[int]] = {
    ("Posterize", 0): [0, 0, 0, 0, 0, 0, 0, 128, 128, 128],  # 0 bits: shift 8 clamped to 7
    ("Posterize", 2): [0, 0, 0, 0, 0, 0, 0, 128, 128, 128],  # v0's ('Posterize', 0.8, 2): int(0.8) = 0 bits
    ("Posterize", 3): [0, 0, 0, 0, 0, 0, 0, 128, 128, 128],  # 1 bit: shift 7
    ("Posterize", 6): [0, 0, 64, 64, 64, 64, 64, 128, 192, 192],  # v0's level 6: 2 bits, shift 6
    ("Posterize", 10): [0, 0, 64, 64, 64, 96, 112, 128, 192, 240],  # 4 bits, shift 4
    ("Solarize", 0): INVERTED,  # threshold 0: nothing is below it
    ("Solarize", 3): [0, 1, 75, 179, 178, 155, 128, 127, 55, 0],  # int(76.8) = 76: 76 inverted
    ("Solarize", 5): [0, 1, 75, 76, 77, 100, 127, 127, 55, 0],  # 128
    ("Solarize", 10): INVERTED,  # v0's ('Solarize', 0.6, 10): 256 as uint8 is 0
}
# NVIDIA PyTorch's (PIL) at the same levels, where they differ from TF's
PYTORCH_TABLE: dict[tuple[str, int], list[int]] = {
    ("Posterize", 0): [0] * len(PIXELS),  # round(0) = 0 bits: PIL's table i & ~255
    ("Posterize", 2): [0, 0, 0, 0, 0, 0, 0, 128, 128, 128],  # round(0.8) = 1 bit: as TF
    ("Posterize", 4): [0, 0, 64, 64, 64, 64, 64, 128, 192, 192],  # round(1.6) = 2 bits (TF: int(1.6) = 1)
    ("Solarize", 3): [0, 1, 75, 76, 178, 155, 128, 127, 55, 0],  # 76 < 76.8 stays
    ("Solarize", 10): PIXELS,  # everything is below 256
}
ALL_LEVELS = np.repeat(np.arange(256, dtype=np.uint8).reshape(16, 16, 1), 3, axis=2)  # every uint8 value


def _timm_op(name: str, level: int, ops: str):
    """One op of timm's AutoAugment at `level`, with the ops data.autoaugment_ops=`ops` installs."""
    from timm.data.auto_augment import AugmentOp, AutoAugment

    from imgcls.data.augment import autoaugment_hparams, with_nvidia_ops

    hparams = autoaugment_hparams(224, Image.Resampling.NEAREST)
    (op,) = with_nvidia_ops(AutoAugment([[AugmentOp(name, 1.0, level, hparams)]]), ops).policy[0]
    return op


def _torchvision(name: str, level: int, ops: str, image: np.ndarray) -> np.ndarray:
    return np.asarray(_timm_op(name, level, ops)(Image.fromarray(image)))


def _dali(cases: list[tuple[str, int]], ops: str, image: np.ndarray) -> list[np.ndarray]:
    """The DALI policy's Posterize/Solarize (tf_autoaugment.v0_policy) at each (name, level) of `cases`."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug.core import Policy

    from imgcls.data.dali.tf_autoaugment import nvidia_auto_augment, v0_policy

    policy = v0_policy(max_translate_abs=250, ops=ops)
    singles = [
        Policy(
            name=f"{name}{level}",
            num_magnitude_bins=policy.num_magnitude_bins,
            sub_policies=[[(policy.augmentations[f"{ops}_{name.lower()}"], 1.0, level)]],
        )
        for name, level in cases
    ]

    @pipeline_def(enable_conditionals=True, batch_size=1, num_threads=1, device_id=None, seed=0)
    def pipe():
        images = fn.external_source(source=lambda: [image], layout="HWC", dtype=types.UINT8)
        return tuple(nvidia_auto_augment(images, single) for single in singles)

    dali = pipe()
    dali.build()
    return [np.asarray(out[0]) for out in dali.run()]


def _pixels(out: np.ndarray) -> list[int]:
    """The output at PIXELS' values of ALL_LEVELS (channel 0)."""
    return [int(out.reshape(-1, 3)[p, 0]) for p in PIXELS]


def test_tf_reference_is_tensorflows_table() -> None:
    """The numpy TF2 ops of test_autoaugment_backends reproduce TensorFlow's outputs."""
    for (name, level), values in TF_TABLE.items():
        ref = (tf_posterize if name == "Posterize" else tf_solarize)(ALL_LEVELS, level)
        assert _pixels(ref) == values, (name, level)


@pytest.mark.parametrize("ops", ["tf2", "pytorch"])
def test_posterize_and_solarize_at_every_level_on_torchvision(ops: str) -> None:
    table = TF_TABLE if ops == "tf2" else PYTORCH_TABLE
    for name in ("Posterize", "Solarize"):
        for level in range(11):
            out = _torchvision(name, level, ops, ALL_LEVELS)
            assert np.array_equal(out, _reference(name, level, ops, ALL_LEVELS)), (name, level)
            if (name, level) in table:
                assert _pixels(out) == table[name, level], (name, level)


@pytest.mark.parametrize("ops", ["tf2", "pytorch"])
def test_posterize_and_solarize_at_every_level_on_dali(ops: str) -> None:
    pytest.importorskip("nvidia.dali")
    table = TF_TABLE if ops == "tf2" else PYTORCH_TABLE
    cases = [(name, level) for name in ("Posterize", "Solarize") for level in range(11)]
    for (name, level), out in zip(cases, _dali(cases, ops, ALL_LEVELS)):
        assert np.array_equal(out, _reference(name, level, ops, ALL_LEVELS)), (name, level)
        if (name, level) in table:
            assert _pixels(out) == table[name, level], (name, level)


def _reference(name: str, level: int, ops: str, image: np.ndarray) -> np.ndarray:
    if ops == "tf2":
        return (tf_posterize if name == "Posterize" else tf_solarize)(image, level)
    return np.asarray(pyt_op(Image.fromarray(image), name, level, 1))


@pytest.fixture(scope="module")
def photo(tmp_path_factory: pytest.TempPathFactory) -> Image.Image:
    (path,) = sample_photos(tmp_path_factory.mktemp("shear_photo"), 1)
    with Image.open(path) as image:
        return image.convert("RGB").crop((208, 100, 432, 324))  # 224 x 224, no resampling


def _sheared(photo: Image.Image, name: str, shear: float, resample: Image.Resampling) -> np.ndarray:
    matrix = (1, shear, 0, 0, 1, 0) if name == "ShearX" else (1, 0, 0, shear, 1, 0)
    return np.asarray(photo.transform(photo.size, Image.AFFINE, matrix, resample, fillcolor=(FILL,) * 3))


def _mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int64) - b.astype(np.int64)).mean())


def test_pytorch_recipes_shear_bicubically_as_pil(photo: Image.Image) -> None:
    """The PyTorch EfficientNet's v0 Shears (from its composed transform) give PIL's affine BICUBIC output of the
    photo, to the pixel, for the sign they draw (PYT autoaugment.py:107-112); the TF2 EfficientNet's the NEAREST."""
    from timm.data.auto_augment import AutoAugment

    from imgcls.data.transforms import train_transform

    for ops, resample in [("pytorch", Image.Resampling.BICUBIC), ("tf2", Image.Resampling.NEAREST)]:
        data = compose_config([f"experiment={EXPERIMENT[ops]}", "data.backend=torchvision"]).data
        (autoaugment,) = [t for t in train_transform(data).transforms if isinstance(t, AutoAugment)]
        shears = [op for sub in autoaugment.policy for op in sub if op.name.startswith("Shear") and op.magnitude]
        assert len(shears) == 4  # v0: ShearY 4, ShearX 9, ShearY 3, ShearY 7
        for op in shears:
            shear = op.magnitude / 10 * 0.3
            for seed in range(4):
                random.seed(seed)
                op.prob = 1.0
                out = np.asarray(op(photo))
                assert min(_mean_abs(out, _sheared(photo, op.name, s, resample)) for s in (shear, -shear)) == 0.0
        if ops == "pytorch":  # nearest would be far from it: the test tells the two apart
            bicubic, nearest = (_sheared(photo, "ShearX", 0.27, r) for r in (resample, Image.Resampling.NEAREST))
            assert _mean_abs(bicubic, nearest) > 1.0


# DALI's warp_affine has no bicubic (nearest and linear only), so the PyTorch recipes shear linearly on DALI. Measured
# against PIL's bicubic on the photo at v0's shears (mean |difference| in grey levels, worst of four draws): DALI's
# linear 2.2-2.5, its nearest 4.1-4.6; PIL's own bilinear is 1.9-2.1 from its bicubic, and DALI's linear 0.4-0.5
# from PIL's bilinear, so what is left is the interpolation, not the geometry.
DALI_LINEAR_SHEAR_LIMIT = 3.0


def test_dali_shears_linearly_for_the_pytorch_recipes_close_to_pils_bicubic(photo: Image.Image) -> None:
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug import augmentations
    from nvidia.dali.auto_aug.core import Policy

    from imgcls.data.dali.tf_autoaugment import nvidia_auto_augment, v0_policy

    augs = v0_policy(max_translate_abs=250, ops="pytorch").augmentations
    assert sorted(name for name in augs if "shear" in name) == ["linear_shear_x", "linear_shear_y"]
    linear = {"ShearX": augs["linear_shear_x"], "ShearY": augs["linear_shear_y"]}
    nearest = {"ShearX": augmentations.shear_x, "ShearY": augmentations.shear_y}  # interp_type NN from the kwargs
    cases = [("ShearX", 9), ("ShearY", 3), ("ShearY", 4), ("ShearY", 7)]  # v0's shears
    singles = [
        Policy(name=f"{kind}{name}{level}", num_magnitude_bins=11, sub_policies=[[(aug[name], 1.0, level)]])
        for name, level in cases
        for kind, aug in (("linear", linear), ("nearest", nearest))
    ]
    image = np.asarray(photo)

    @pipeline_def(enable_conditionals=True, batch_size=4, num_threads=1, device_id=None, seed=0)
    def pipe():
        images = fn.external_source(source=lambda: [image] * 4, layout="HWC", dtype=types.UINT8)
        return tuple(nvidia_auto_augment(images, single) for single in singles)

    dali = pipe()
    dali.build()
    outputs = iter(dali.run())
    for name, level in cases:
        shear = level / 10 * 0.3
        refs = [_sheared(photo, name, s, Image.Resampling.BICUBIC) for s in (shear, -shear)]
        linear_out, nearest_out = next(outputs), next(outputs)
        linear_diff = max(min(_mean_abs(np.asarray(s), r) for r in refs) for s in linear_out)
        nearest_diff = max(min(_mean_abs(np.asarray(s), r) for r in refs) for s in nearest_out)
        assert linear_diff < DALI_LINEAR_SHEAR_LIMIT < nearest_diff, (name, level, linear_diff, nearest_diff)


# The opt-in comparison with TensorFlow itself: NVIDIA TF2's two expressions at every level, eagerly and in a graph
# (tf.function, where NVIDIA's tf.data map ran them; with NumPy 2 the graph refuses 256 as a uint8 constant).
TF_SCRIPT = r"""
import json
import numpy as np
import tensorflow as tf
image = tf.constant(np.arange(256, dtype=np.uint8))
def posterize(image, bits):
    shift = 8 - bits
    return tf.bitwise.left_shift(tf.bitwise.right_shift(image, shift), shift)
def solarize(image, threshold):
    return tf.where(image < threshold, image, 255 - image)
out = {"posterize": [], "solarize": [], "graph_solarize": []}
for level in range(11):
    out["posterize"].append(posterize(image, int((level / 10.0) * 4)).numpy().tolist())
    threshold = int((level / 10.0) * 256)
    out["solarize"].append(solarize(image, threshold).numpy().tolist())
    try:
        out["graph_solarize"].append(tf.function(lambda x: solarize(x, threshold))(image).numpy().tolist())
    except Exception as error:
        out["graph_solarize"].append(type(error).__name__)
print(json.dumps(out))
"""


def _tf_python() -> str | None:
    if os.environ.get("IMGCLS_TF_PYTHON"):
        return os.environ["IMGCLS_TF_PYTHON"]
    return sys.executable if importlib.util.find_spec("tensorflow") else None


@pytest.mark.skipif(_tf_python() is None, reason="needs tensorflow (importable here, or IMGCLS_TF_PYTHON)")
def test_tf2_ops_are_what_tensorflow_computes_at_every_level() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([_tf_python(), "-c", TF_SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    tf_out = json.loads(done.stdout.strip().splitlines()[-1])
    gradient = np.arange(256, dtype=np.uint8)
    for level in range(11):
        for name in ("Posterize", "Solarize"):
            ours = _torchvision(name, level, "tf2", ALL_LEVELS).reshape(-1, 3)[:, 0].tolist()
            assert ours == tf_out[name.lower()][level], (name, level)
        graph = tf_out["graph_solarize"][level]
        assert graph == tf_out["solarize"][level] or graph == "OverflowError", level
    assert tf_out["solarize"][10] == (255 - gradient).tolist()
