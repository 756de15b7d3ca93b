"""The embedded demo dataset: scikit-learn's handwritten digits written once as a JPEG ImageFolder.

The digits (1,797 real 8x8 scans, 10 classes) ship inside scikit-learn, so the demo needs no download.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

DEMO_SIZE = 32  # pixels; the 8x8 scans are upscaled so that a stock ResNet stem has room
VAL_EVERY = 5  # every 5th image of a class goes to val: a deterministic, stratified 80/20 split


def ensure_demo_dataset(root: str | Path) -> Path:
    """Create ROOT/{train,val}/<digit>/*.jpg unless it exists; return ROOT. Safe to call concurrently."""
    root = Path(root).expanduser()
    if (root / ".complete").exists():
        return root
    from sklearn.datasets import load_digits

    digits = load_digits()
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".digits-", dir=root.parent))
    seen: dict[int, int] = {}
    for image, label in zip(digits.images, digits.target):
        index = seen.get(int(label), 0)
        seen[int(label)] = index + 1
        split = "val" if index % VAL_EVERY == VAL_EVERY - 1 else "train"
        folder = staging / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (255 - image * (255 / 16)).astype(np.uint8)  # dark ink on white paper
        picture = Image.fromarray(pixels, mode="L").resize((DEMO_SIZE, DEMO_SIZE), Image.BILINEAR)
        picture.convert("RGB").save(folder / f"{index:04d}.jpg", quality=95)
    (staging / ".complete").touch()
    try:
        os.rename(staging, root)  # atomic: readers see all of it or nothing
    except OSError:  # another process won the race, or a partial old dir is in the way
        if (root / ".complete").exists():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            shutil.rmtree(root, ignore_errors=True)
            os.rename(staging, root)
    return root
