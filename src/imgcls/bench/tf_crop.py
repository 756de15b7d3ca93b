"""`python -m imgcls.bench.tf_crop [--batch-size 256] [--batches 50]`: the host cost of TF's crop in DALI.

NVIDIA's TF recipes (`data.train_crop=tf`) choose each crop window with TF's sample_distorted_bounding_box,
in Python inside the DALI pipeline (data/tf_crop.py, data/dali/pipelines.py `tf_windows`). That Python
holds its process's GIL, which the training thread needs to launch its kernels, so its time a batch is host
time taken from every step. The table gives the milliseconds a batch of that pipeline step (the random
numbers, the window choice, DALI's conversions), run by DALI on the CPU, for:

- one call a batch (`batch_processing=True`, `sample_windows` over the whole batch): what imgcls runs;
- one call an image (DALI's default python_function), the same windows, for comparison;
- the random numbers alone (`fn.random.uniform`, no Python), the floor under both.

Each with the whole image as the box (TF2) and with two object boxes an image (TF1's records). Both ways
are checked to give the same windows from the same seed; the command fails otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from imgcls.data.dali.pipelines import _many, crop_spec_values, tf_windows
from imgcls.data.tf_crop import UNIFORMS_PER_ATTEMPT, DistortedCrop

IMAGE_SHAPE = (375, 500, 3)  # the median ImageNet photo
BOXES = ((0.1, 0.55), (0.2, 0.3), (0.45, 0.95), (0.6, 0.7))  # per coordinate (ymin, xmin, ymax, xmax): 2 boxes


def tf_window_per_image(shape: np.ndarray, uniforms: np.ndarray, spec: np.ndarray, *boxes: np.ndarray) -> Any:
    """One image's window, for DALI's per-sample python_function (the comparison row): tf_windows on a batch of one."""
    anchors, extents = tf_windows([shape], [uniforms], [spec], *([side] for side in boxes))
    return anchors[0], extents[0]


def _pipeline(batch_size: int, way: str, boxed: bool) -> Any:
    from nvidia.dali import fn, pipeline_def, types

    spec = DistortedCrop()

    @pipeline_def
    def windows() -> Any:
        uniforms = fn.random.uniform(range=[0.0, 1.0], shape=[spec.max_attempts, UNIFORMS_PER_ATTEMPT])
        if way == "uniforms":
            return uniforms
        inputs = [
            types.Constant(np.array(IMAGE_SHAPE, np.int64)),
            uniforms,
            types.Constant(np.array(crop_spec_values(spec), np.float32)),
        ]
        inputs += [types.Constant(np.array(b, np.float32)) for b in BOXES] if boxed else []
        if way == "batch":
            return tuple(_many(fn.python_function(*inputs, function=tf_windows, num_outputs=2, batch_processing=True)))
        return tuple(_many(fn.python_function(*inputs, function=tf_window_per_image, num_outputs=2)))

    # one thread, run synchronously: the step's own time a batch, as DALI's thread spends it
    pipe = windows(batch_size=batch_size, num_threads=1, device_id=None, seed=7, exec_async=False, exec_pipelined=False)
    pipe.build()
    return pipe


def _time(run: Callable[[], Any], batches: int) -> float:
    run()
    samples = []
    for _ in range(batches):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def _windows(pipe: Any) -> np.ndarray:
    anchors, shapes = pipe.run()
    return np.concatenate([np.stack([np.asarray(t) for t in anchors]), np.stack([np.asarray(t) for t in shapes])], 1)


def measure(batch_size: int, batches: int) -> list[tuple[str, str, float]]:
    """(way, box, ms a batch) rows; raises RuntimeError where the two ways choose different windows."""
    rows = []
    for boxed in (False, True):
        box = "2 object boxes" if boxed else "whole image"
        pipes = {way: _pipeline(batch_size, way, boxed) for way in ("batch", "image")}
        for _ in range(3):
            if not np.array_equal(_windows(pipes["batch"]), _windows(pipes["image"])):
                raise RuntimeError("one call a batch and one call an image chose different windows")
        rows.append(("one call a batch (imgcls)", box, _time(pipes["batch"].run, batches)))
        rows.append(("one call an image", box, _time(pipes["image"].run, batches)))
    rows.append(("random numbers alone", "-", _time(_pipeline(batch_size, "uniforms", False).run, batches)))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m imgcls.bench.tf_crop", description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=50, help="timed batches a row (the median is shown)")
    args = parser.parse_args(argv)
    rows = measure(args.batch_size, args.batches)
    print(f"TF crop windows in the DALI pipeline, {args.batch_size} images a batch, {IMAGE_SHAPE[1]}x{IMAGE_SHAPE[0]}")
    print(f"{'way':<28} {'box':<16} {'ms a batch':>10}")
    for way, box, ms in rows:
        print(f"{way:<28} {box:<16} {ms:>10.2f}")
    print("same windows both ways: yes")


if __name__ == "__main__":
    main()
