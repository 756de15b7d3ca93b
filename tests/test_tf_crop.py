"""TF's training crop (data/tf_crop.py): tf.image.sample_distorted_bounding_box as NVIDIA's TF1 and TF2 call it
(TF1/utils/image_processing.py:52-61, TF2/dataloader/preprocessing.py:227-237), on the torchvision backend.

The DALI backend's windows come from the same `sample_windows`, a batch at a time (tests/test_dali.py checks the
pipeline); tests/tf_crop_reference.py, TF's kernel one attempt at a time, is its oracle. The opt-in test at the
end compares the sampler with TensorFlow's own op over many draws."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from imgcls.data.protocol import LoaderSpec
from imgcls.data.tf_crop import (
    OBJECT_BOXES_INFO,
    DistortedCrop,
    TFDistortedCrop,
    padded_boxes,
    sample_window,
    sample_windows,
)
from imgcls.data.transforms import train_transform
from tests.conftest import compose_config, make_image_folder, tiny_overrides
from tests.tf_crop_reference import reference_window

NVIDIA = DistortedCrop(area_range=(0.05, 1.0), aspect_range=(0.75, 1.33), min_object_covered=0.1, max_attempts=100)


def _covered(window: tuple[int, int, int, int], box: tuple[int, int, int, int]) -> float:
    """Fraction of the pixel box (x0, y0, x1, y1) inside the window (y, x, h, w)."""
    y, x, h, w = window
    ix = max(0, min(x + w, box[2]) - max(x, box[0]))
    iy = max(0, min(y + h, box[3]) - max(y, box[1]))
    return ix * iy / ((box[2] - box[0]) * (box[3] - box[1]))


@pytest.mark.parametrize(
    "boxes", [None, np.array([[0.3, 0.55, 0.5, 0.9]]), np.array([[0, 0, 0.1, 0.1], [0.5, 0.5, 1, 1]])]
)
def test_every_window_covers_the_minimum_of_a_box_within_the_ranges(boxes: np.ndarray | None) -> None:
    """Whatever the draw: inside the image, area and aspect in range (up to TF's rounding of the width), and
    at least 10 % of one object box (the whole image when there is none) inside the crop, or the whole image."""
    rng = np.random.default_rng(0)
    for _ in range(3000):
        height, width = (int(v) for v in rng.integers(20, 700, 2))
        y, x, h, w = window = sample_window(height, width, NVIDIA, rng.random((100, 4)), boxes)
        assert 0 <= y and 0 <= x and y + h <= height and x + w <= width and h > 0 and w > 0
        if (h, w) == (height, width):
            continue  # the fallback, or a draw of the whole image
        assert 0.05 * height * width * (1 - 1e-6) <= h * w <= height * width  # TF compares in float32
        assert 0.75 - 0.5 / h <= w / h <= 1.33 + 0.5 / h  # width = round(aspect x height)
        pixel = (
            [(0, 0, width, height)]
            if boxes is None
            else [(int(b[1] * width), int(b[0] * height), int(b[3] * width), int(b[2] * height)) for b in boxes]
        )
        assert max(_covered(window, b) for b in pixel if (b[2] - b[0]) * (b[3] - b[1]) >= 1) >= 0.1


def _random_boxes(rng: np.random.Generator) -> np.ndarray | None:
    """None (the whole image), or 1-4 boxes: ordinary, inverted, empty, or reaching past the image."""
    kind = int(rng.integers(0, 4))
    if kind == 0:
        return None
    boxes = rng.random((int(rng.integers(1, 5)), 4)).astype(np.float32)
    if kind == 1:  # ordinary: min < max
        boxes = np.concatenate([np.minimum(boxes[:, :2], boxes[:, 2:]), np.maximum(boxes[:, :2], boxes[:, 2:])], 1)
    elif kind == 3:
        boxes = boxes * 1.4 - 0.2
    return boxes


def test_a_batch_of_windows_is_tfs_attempt_loop_image_by_image() -> None:
    """sample_windows (every attempt of every image at once) picks exactly the window of TF's kernel run one
    attempt at a time (tests/tf_crop_reference.py), over sizes from 1 px, aspect and area ranges beyond
    NVIDIA's, every coverage, object boxes of every kind, and float32 (DALI's) or float64 (Python's) draws."""
    rng = np.random.default_rng(7)
    checked = fallbacks = 0
    for _ in range(300):
        low_area = float(rng.choice([0.01, 0.05, 0.3]))
        low_aspect = float(rng.choice([0.2, 0.75, 1.0]))
        spec = DistortedCrop(
            area_range=(low_area, float(rng.choice([0.5, 1.0]))),
            aspect_range=(low_aspect, low_aspect * float(rng.choice([1.0, 1.77, 8.0]))),
            min_object_covered=float(rng.choice([0.0, 0.1, 0.5, 1.0])),
            max_attempts=int(rng.choice([1, 3, 100])),
        )
        batch = int(rng.integers(1, 9))
        heights, widths = (rng.integers(1, int(rng.choice([8, 64, 900])), batch) for _ in range(2))
        uniforms = rng.random((batch, spec.max_attempts, 4), dtype=rng.choice([np.float32, np.float64]))
        boxes = [_random_boxes(rng) for _ in range(batch)]
        windows = sample_windows(heights, widths, spec, uniforms, padded_boxes(boxes))
        for i in range(batch):
            expected = reference_window(int(heights[i]), int(widths[i]), spec, uniforms[i], boxes[i])
            assert tuple(int(v) for v in windows[i]) == expected, (spec, heights[i], widths[i], boxes[i])
            checked += 1
            fallbacks += expected == (0, 0, int(heights[i]), int(widths[i]))
    assert checked > 1000 and 0.05 < fallbacks / checked < 0.9  # both ways of ending are exercised


def test_the_pipelines_window_step_reads_records_boxes_as_the_torchvision_reader_does() -> None:
    """pipelines.tf_windows takes DALI's four coordinate lists a record: a record without boxes is the whole
    image, one whose lists differ in length keeps as many boxes as its shortest list (tfrecord.decode_example)."""
    pytest.importorskip("nvidia.dali")
    from imgcls.data.dali.pipelines import crop_spec_values, tf_windows

    rng = np.random.default_rng(3)
    boxes = [
        np.array([[0.1, 0.1, 0.3, 0.2], [0.5, 0.6, 0.9, 0.95]], np.float32),
        None,
        np.array([[0.0, 0.7, 0.2, 0.9]]),
    ]
    sides = [
        [np.asarray(b[:, k], np.float32) if b is not None else np.zeros(0, np.float32) for b in boxes] for k in range(4)
    ]
    sides[3][0] = np.append(sides[3][0], 0.99).astype(np.float32)  # xmax lists a third box: cut to two
    shapes = [np.array([300, 400, 3]), np.array([200, 250, 3]), np.array([500, 375, 3])]
    spec = np.array(crop_spec_values(NVIDIA), np.float32)
    for _ in range(50):
        uniforms = [rng.random((100, 4), dtype=np.float32) for _ in shapes]
        anchors, extents = tf_windows(shapes, uniforms, [spec] * 3, *sides)
        for i, (shape, u) in enumerate(zip(shapes, uniforms)):
            expected = sample_window(int(shape[0]), int(shape[1]), NVIDIA, u, boxes[i])
            assert (*anchors[i].tolist(), *extents[i].tolist()) == expected


def test_whole_image_box_rejects_every_crop_under_a_tenth_of_the_image() -> None:
    """TF2 passes the whole image as the box: area_range's 5 % is never reached, 10 % is the floor. The crop's
    height is uniform between the smallest and largest allowed heights, so areas pile up at the low end."""
    rng = np.random.default_rng(1)
    windows = np.array([sample_window(375, 500, NVIDIA, rng.random((100, 4))) for _ in range(4000)])
    area = windows[:, 2] * windows[:, 3] / (375 * 500)
    assert area.min() >= 0.1
    assert area.min() < 0.11
    assert 0.36 < area.mean() < 0.41  # torchvision's uniform area in [0.05, 1] averages 0.525
    assert np.mean(area < 0.5) > 0.6


def test_no_successful_attempt_gives_the_whole_image() -> None:
    """max_attempts misses -> the whole image (TF's fallback), never a partial window."""
    impossible = DistortedCrop(
        area_range=(0.05, 0.5), aspect_range=(0.75, 1.33), min_object_covered=1.0, max_attempts=5
    )
    rng = np.random.default_rng(2)
    for _ in range(200):
        assert sample_window(300, 400, impossible, rng.random((5, 4))) == (0, 0, 300, 400)
    # A box of no pixels counts for nothing: no attempt can cover it, so the whole image too.
    empty = np.array([[0.5, 0.5, 0.5, 0.5]])
    assert sample_window(300, 400, NVIDIA, rng.random((100, 4)), empty) == (0, 0, 300, 400)


def test_one_attempt_reads_tfs_random_numbers_in_order() -> None:
    """One attempt by hand, as GenerateRandomCrop computes it: aspect = 0.75 + u0 x 0.58, height = uniform
    integer over [lrint(sqrt(0.05 x 400 x 300 / aspect)), lrint(sqrt(400 x 300 / aspect))] clipped to the image,
    width = lrint(height x aspect), offsets floor(u x (size - crop))."""
    u = np.array([[0.5, 0.25, 0.5, 0.75]])
    aspect = np.float32(0.5) * np.float32(1.33 - 0.75) + np.float32(0.75)  # 1.04
    low = int(np.rint(np.sqrt(np.float32(6000) / aspect)))
    high = min(int(np.rint(np.sqrt(np.float32(120000) / aspect))), 300)
    height = low + int(0.25 * (high - low + 1))
    width = int(np.rint(np.float32(height) * aspect))
    spec = DistortedCrop(max_attempts=1)
    assert sample_window(300, 400, spec, u) == (int(0.5 * (300 - height)), int(0.75 * (400 - width)), height, width)


def _photo(tmp_path: Path, size: tuple[int, int] = (500, 375)) -> Image.Image:
    path = tmp_path / "photo.jpg"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path, quality=90)
    return Image.open(path)


@pytest.mark.parametrize("experiment", ["tf2_efficientnet_b0_8xa100_amp", "tf1_resnet50_dgx1v_amp_90e"])
def test_tf_recipes_crop_with_tfs_sampler_on_torchvision(experiment: str, tmp_path: Path) -> None:
    """The TF recipes' torchvision transform crops as TF does: never under 10 % of the image (torchvision's
    RandomResizedCrop with area_range [0.05, 1] went down to 5 %)."""
    data = compose_config([f"experiment={experiment}", "data.backend=torchvision"]).data
    crop = train_transform(data).transforms[0]
    assert isinstance(crop, TFDistortedCrop)
    assert crop.spec == NVIDIA
    image = _photo(tmp_path)
    random.seed(0)
    windows = np.array([crop.get_params(image) for _ in range(3000)])
    assert (windows[:, 2] * windows[:, 3]).min() >= 0.1 * 500 * 375
    out = crop(image)
    assert out.size == (data.image_size, data.image_size)


def test_pytorch_recipes_keep_torchvisions_random_resized_crop() -> None:
    data = compose_config(["experiment=resnet50_dgx1v_amp_90e", "data.backend=torchvision"]).data
    assert data.train_crop == "random_resized"
    assert not isinstance(train_transform(data).transforms[0], TFDistortedCrop)


def test_object_boxes_with_the_image_steer_the_crop(tmp_path: Path) -> None:
    """TF1: the records' object boxes travel with the decoded image (PIL info); every crop covers 10 % of one."""
    crop = TFDistortedCrop(64, NVIDIA)
    image = _photo(tmp_path)
    image.info[OBJECT_BOXES_INFO] = np.array([[0.0, 0.8, 0.2, 1.0]], np.float32)  # top-right corner, 4 % of the image
    random.seed(1)
    box = (400, 0, 500, 75)
    for _ in range(500):
        window = crop.get_params(image)
        assert _covered(window, box) >= 0.1 or window == (0, 0, 375, 500)


# The opt-in comparison with TensorFlow's own op: a python with tensorflow (this one, or IMGCLS_TF_PYTHON's).
TF_SCRIPT = r"""
import json, sys
import tensorflow as tf
job = json.loads(sys.stdin.read())
tf.random.set_seed(0)
out = []
for case in job["cases"]:
    boxes = tf.constant(case["boxes"] or [[0.0, 0.0, 1.0, 1.0]], tf.float32)[None]
    size = tf.constant([case["height"], case["width"], 3], tf.int32)
    draws = []
    for _ in range(job["draws"]):
        begin, extent, _ = tf.image.sample_distorted_bounding_box(
            size, bounding_boxes=boxes, min_object_covered=0.1, aspect_ratio_range=[0.75, 1.33],
            area_range=[0.05, 1.0], max_attempts=100, use_image_if_no_bounding_boxes=True)
        draws.append([int(begin[0]), int(begin[1]), int(extent[0]), int(extent[1])])
    out.append(draws)
print(json.dumps(out))
"""


def _tf_python() -> str | None:
    if os.environ.get("IMGCLS_TF_PYTHON"):
        return os.environ["IMGCLS_TF_PYTHON"]
    return sys.executable if importlib.util.find_spec("tensorflow") else None


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    grid = np.union1d(a, b)
    return float(
        np.abs(
            np.searchsorted(np.sort(a), grid, "right") / len(a) - np.searchsorted(np.sort(b), grid, "right") / len(b)
        ).max()
    )


@pytest.mark.skipif(_tf_python() is None, reason="needs tensorflow (importable here, or IMGCLS_TF_PYTHON)")
def test_sampler_draws_as_tensorflows_sample_distorted_bounding_box() -> None:
    """Opt-in: over 4000 draws per case, the areas, aspects, offsets and fallback rate of sample_window and of
    tf.image.sample_distorted_bounding_box agree (two-sample KS statistic < 0.045, about the 1 % level)."""
    cases = [
        {"height": 375, "width": 500, "boxes": None},  # TF2: the whole image
        {"height": 333, "width": 500, "boxes": [[0.35, 0.4, 0.6, 0.7]]},  # TF1: an object box
        {"height": 500, "width": 281, "boxes": [[0.0, 0.0, 0.15, 0.2], [0.7, 0.6, 0.95, 0.9]]},
    ]
    draws = 4000
    job = json.dumps({"cases": cases, "draws": draws})
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [_tf_python(), "-c", TF_SCRIPT], input=job, capture_output=True, text=True, timeout=900, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tf_windows = json.loads(done.stdout.strip().splitlines()[-1])
    rng = np.random.default_rng(0)
    for case, theirs in zip(cases, tf_windows):
        boxes = np.array(case["boxes"]) if case["boxes"] else None
        ours = np.array(
            [sample_window(case["height"], case["width"], NVIDIA, rng.random((100, 4)), boxes) for _ in range(draws)]
        )
        theirs = np.array(theirs)
        for name, stat in {
            "area": lambda w: w[:, 2] * w[:, 3],
            "aspect": lambda w: w[:, 3] / w[:, 2],
            "y": lambda w: w[:, 0],
            "x": lambda w: w[:, 1],
        }.items():
            assert _ks(stat(ours), stat(theirs)) < 0.045, (case, name)


# --- DALI (dali_cpu): the same sampler picks the window, fn.decoders.image_slice decodes it ------------------


def _dali_cfg(root: Path, *extra: str):
    pytest.importorskip("nvidia.dali")
    overrides = tiny_overrides(root, "data.backend=dali_cpu", "recipe=tf2_efficientnet", "recipe.augment=null", *extra)
    return compose_config([*overrides, "data.train_crop_scale=[0.05,1.0]", "data.train_crop_ratio=[0.75,1.33]"]).data


@pytest.mark.parametrize("resize", ["torch", "dali"])
def test_dali_crops_of_the_tf_recipes_never_go_under_a_tenth(tmp_path: Path, resize: str) -> None:
    """DALI's random crop with random_area [0.05, 1] went down to 5 % of the image; TF's sampler never under 10 %."""
    from imgcls.data.backends import make_backend

    root = make_image_folder(tmp_path / "big", classes=1, train_per_class=2, val_per_class=1, size=(400, 300))
    cfg = _dali_cfg(root, f"data.dali_train_resize={resize}")
    assert cfg.train_crop == "tf"
    backend = make_backend(cfg)
    backend.settings = replace(backend.settings, with_crop_shape=True)  # the crops' shapes as an output
    loader = backend.loader(LoaderSpec("train", 2, seed=3))
    shapes = torch.cat([next(iter(loader))[2] for _ in range(150)]).double()  # (h, w, c) of each crop
    area = shapes[:, 0] * shapes[:, 1] / (400 * 300)
    aspect = shapes[:, 1] / shapes[:, 0]
    assert area.min() >= 0.1 and area.max() <= 1.0, (area.min(), area.max())
    assert 0.36 < area.mean() < 0.44  # TF's: 0.387 for 500x375 over 20000 draws (test above); RRC's: 0.525
    assert aspect.min() >= 0.745 and aspect.max() <= 1.335
    assert next(iter(loader))[0].shape == (2, 3, 32, 32)


def _boxed_records(root: Path) -> Path:
    """NVIDIA TF1-style TFRecords (build_imagenet_data.py features): 400x300 images, red in the object box (the
    top-left quarter), blue elsewhere."""
    from imgcls.data.shards.tfrecord import encode_example, write_record

    pixels = np.zeros((300, 400, 3), np.uint8)
    pixels[..., 2] = 220
    pixels[:150, :200] = (220, 0, 0)
    path = root / "photo.jpg"
    root.mkdir(parents=True)
    Image.fromarray(pixels).save(path, quality=95)
    for split in ("train", "validation"):
        with open(root / f"{split}-00000-of-00001", "wb") as out:
            for i in range(4):
                write_record(out, encode_example(path.read_bytes(), 1, f"{i}.jpg", boxes=[(0.0, 0.0, 0.5, 0.5)]))
    return root


@pytest.mark.parametrize("backend", ["dali_cpu", "torchvision"])
def test_both_backends_read_tf1s_object_boxes_from_the_records(tmp_path: Path, backend: str) -> None:
    """TF1: every crop covers at least 10 % of the record's object box (red); with the whole image as the box
    (train_crop_object_boxes=false, TF2) some crops hold no red at all. (The torchvision backend's shard reader
    cropped against the whole image either way.)"""
    from imgcls.data.backends import make_backend

    root = _boxed_records(tmp_path / "records")
    red_share = {}
    for boxes in (True, False):
        options = [
            "data.format=tfrecord", f"data.shard_cache={tmp_path / 'cache'}", "data.hflip=0",
            f"data.train_crop_object_boxes={boxes}", "data.num_classes=1",
        ]  # fmt: skip
        if backend == "dali_cpu":
            cfg = _dali_cfg(root, *options, "data.dali_train_resize=dali")
        else:
            overrides = tiny_overrides(root, "data.backend=torchvision", "recipe=tf2_efficientnet", *options)
            cfg = compose_config([*overrides, "recipe.augment=null", "data.num_workers=0"]).data
        made = make_backend(cfg)
        loader = made.loader(LoaderSpec("train", 4))
        batches = []
        for epoch in range(40):  # one batch an epoch; each epoch draws new crops (DALI: a new pipeline epoch)
            if hasattr(loader, "sampler"):
                loader.sampler.set_epoch(epoch)  # as Lightning does for the torchvision loader
            batches.append(made.on_device(next(iter(loader)))[0])
        images = torch.cat(batches)
        assert len({tuple(b.flatten()[:64].tolist()) for b in batches}) > 20  # 40 epochs, not one batch again
        red_share[boxes] = (images[:, 0] > images[:, 2]).float().mean(dim=(1, 2))
    assert red_share[True].min() > 0.01, red_share[True].min()
    assert (red_share[False] == 0).any()


@pytest.mark.parametrize("lists", ["empty", "missing"])
def test_dali_crops_records_without_object_boxes_against_the_whole_image(tmp_path: Path, lists: str) -> None:
    """TF1 recipe (object boxes on) over records without boxes: imgcls's converter writes empty box lists, as
    TF1's build_imagenet_data.py; records from elsewhere may leave the lists out, which DALI's reader returns as
    its scalar default. Either way the crop is TF's against the whole image, not the whole image every time
    (missing lists made one box without pixels, so every attempt failed)."""
    from imgcls.data.backends import make_backend
    from imgcls.data.shards.tfrecord import BOX_KEYS, _example_class, encode_example, write_record

    root = tmp_path / "records"
    root.mkdir()
    photo = tmp_path / "photo.jpg"
    Image.fromarray(np.full((300, 400, 3), 90, np.uint8)).save(photo, quality=95)
    record = encode_example(photo.read_bytes(), 1, "0.jpg")
    if lists == "missing":
        example = _example_class()()
        example.ParseFromString(record)
        for key in BOX_KEYS:
            del example.features.feature[key]
        record = example.SerializeToString(deterministic=True)
    for split in ("train", "validation"):
        with open(root / f"{split}-00000-of-00001", "wb") as out:
            for _ in range(4):
                write_record(out, record)
    cfg = _dali_cfg(
        root, "data.format=tfrecord", f"data.shard_cache={tmp_path / 'cache'}", "data.dali_train_resize=dali",
        "data.train_crop_object_boxes=true", "data.num_classes=1",
    )  # fmt: skip
    backend = make_backend(cfg)
    backend.settings = replace(backend.settings, with_crop_shape=True)  # the crops' shapes as an output
    loader = backend.loader(LoaderSpec("train", 4))
    shapes = torch.cat([next(iter(loader))[2] for _ in range(10)])
    whole = (shapes[:, 0] == 300) & (shapes[:, 1] == 400)
    assert whole.float().mean() < 0.5, shapes[:8].tolist()  # TF's fallback is rare with the whole image as the box


def test_records_with_and_without_box_lists_are_one_line_naming_the_key(tmp_path: Path) -> None:
    """DALI cannot batch records with box lists and records without them (TF1's recipe reads them): one DataError
    line that says what the records need or which key to set, not DALI's bare dimensionality message."""
    from imgcls.data.backends import make_backend
    from imgcls.data.shards.tfrecord import BOX_KEYS, _example_class, encode_example, write_record
    from imgcls.errors import DataError

    root = tmp_path / "records"
    root.mkdir()
    photo = tmp_path / "photo.jpg"
    Image.fromarray(np.full((60, 80, 3), 90, np.uint8)).save(photo, quality=95)
    boxed = encode_example(photo.read_bytes(), 1, "0.jpg", boxes=[(0.1, 0.1, 0.5, 0.5)])
    example = _example_class()()
    example.ParseFromString(encode_example(photo.read_bytes(), 1, "1.jpg"))
    for key in BOX_KEYS:
        del example.features.feature[key]
    for split in ("train", "validation"):
        with open(root / f"{split}-00000-of-00001", "wb") as out:
            for record in [boxed, example.SerializeToString(deterministic=True)] * 2:
                write_record(out, record)
    cfg = _dali_cfg(
        root, "data.format=tfrecord", f"data.shard_cache={tmp_path / 'cache'}", "data.dali_train_resize=dali",
        "data.train_crop_object_boxes=true", "data.num_classes=1",
    )  # fmt: skip
    with pytest.raises(DataError) as error:
        next(iter(make_backend(cfg).loader(LoaderSpec("train", 4))))
    line = str(error.value)
    assert "\n" not in line and "same dimensionality" in line and "data.train_crop_object_boxes" in line


def test_a_box_of_nan_coordinates_has_no_pixels() -> None:
    """TF refuses NaN box coordinates; here such a box counts for nothing (it was cast to INT64_MIN, with numpy's
    warnings in every batch)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nan_box = np.full((1, 4), np.nan, np.float32)
        assert sample_window(300, 400, NVIDIA, np.random.default_rng(0).random((100, 4)), nan_box) == (0, 0, 300, 400)


def test_dalis_one_call_a_batch_chooses_the_windows_of_one_call_an_image() -> None:
    """The DALI pipeline's window step, one python_function call a batch (pipelines.tf_windows), chooses from
    DALI's random numbers the windows that DALI's per-image calls choose, with and without object boxes
    (bench.tf_crop checks it on every run and stops otherwise)."""
    pytest.importorskip("nvidia.dali")
    from imgcls.bench import tf_crop as bench

    rows = bench.measure(batch_size=16, batches=1)
    assert [(way, box) for way, box, _ in rows] == [
        ("one call a batch (imgcls)", "whole image"), ("one call an image", "whole image"),
        ("one call a batch (imgcls)", "2 object boxes"), ("one call an image", "2 object boxes"),
        ("random numbers alone", "-"),
    ]  # fmt: skip
    assert all(ms > 0 for _, _, ms in rows)
