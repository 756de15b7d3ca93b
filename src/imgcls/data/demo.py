"""The embedded demo dataset: scikit-learn's handwritten digits written once as a JPEG ImageFolder.

The digits (1,797 real 8x8 scans, 10 classes) ship inside scikit-learn, so the demo needs no download.

Ownership: ROOT is imgcls's demo only if it holds the `.complete` marker that imgcls writes last.
A missing ROOT or an empty folder may become the demo; a file or a folder with anything else in it is
refused in one line and left untouched. The dataset is built in a fresh hidden staging folder beside
ROOT (only once ROOT's parent is known to be a folder) and committed with one `rename`, which POSIX
lets replace nothing but an empty directory, so the commit itself cannot destroy anyone's files. The
only thing imgcls ever deletes here is the staging folder it just made.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from imgcls.errors import DataError

DEMO_SIZE = 32  # pixels; the 8x8 scans are upscaled so that a stock ResNet stem has room
VAL_EVERY = 5  # every 5th image of a class goes to val: a deterministic, stratified 80/20 split
MARKER = ".complete"
ALLOWED = "the demo needs a missing or empty folder, or one imgcls made (it holds .complete)"


def ensure_demo_dataset(root: str | Path) -> Path:
    """Create ROOT/{train,val}/<digit>/*.jpg unless it exists; return ROOT. Safe to call concurrently."""
    # The real path, so that a symlink to an empty folder fills the folder rather than replacing the link.
    root = Path(os.path.realpath(Path(root).expanduser()))
    if (root / MARKER).exists():
        return root
    _refuse_unless_free(root)
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where a parent folder should be, or no permission
        raise DataError(f"data.root={root}: cannot create its parent folder ({exc.strerror}); {ALLOWED}") from None
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.imgcls-staging-", dir=root.parent))
    try:
        _write_digits(staging)
        (staging / MARKER).write_text("imgcls demo dataset (scikit-learn digits)\n")
        try:
            os.rename(staging, root)  # atomic: readers see all of it or nothing; replaces at most an empty dir
        except OSError as exc:
            if (root / MARKER).exists():  # another rank or process finished first: use theirs
                return root
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                _refuse_unless_free(root)  # someone else's files appeared while we wrote: name them
            raise DataError(f"data.root={root}: cannot create the demo there ({exc.strerror})") from None
        return root
    finally:
        # Only the staging folder made above; after a successful rename it no longer exists.
        shutil.rmtree(staging, ignore_errors=True)


def _refuse_unless_free(root: Path) -> None:
    """One line if ROOT holds anything that is not imgcls's demo; nothing is touched."""
    if root.is_dir():
        try:
            with os.scandir(root) as entries:
                if next(entries, None) is None:
                    return
        except OSError as exc:
            raise DataError(f"data.root={root} cannot be read ({exc.strerror}); {ALLOWED}") from None
        if not (root / MARKER).exists():
            raise DataError(f"data.root={root} is a folder with other files in it; {ALLOWED}")
    elif os.path.lexists(root):
        raise DataError(f"data.root={root} is a file, not a folder; {ALLOWED}")


def _write_digits(folder: Path) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    seen: dict[int, int] = {}
    for image, label in zip(digits.images, digits.target):
        index = seen.get(int(label), 0)
        seen[int(label)] = index + 1
        split = "val" if index % VAL_EVERY == VAL_EVERY - 1 else "train"
        target = folder / split / str(label)
        target.mkdir(parents=True, exist_ok=True)
        pixels = (255 - image * (255 / 16)).astype(np.uint8)  # dark ink on white paper
        picture = Image.fromarray(pixels, mode="L").resize((DEMO_SIZE, DEMO_SIZE), Image.Resampling.BILINEAR)
        picture.convert("RGB").save(target / f"{index:04d}.jpg", quality=95)
