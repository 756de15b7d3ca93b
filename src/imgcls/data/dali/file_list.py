"""A split's files for DALI's reader: ImageFolder's order and labels, held compactly, written as a file_list."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets.folder import IMG_EXTENSIONS

from imgcls.errors import DataError


class FileList:
    """A split's files in ImageFolder's order (torchvision's make_dataset walk, reproduced), held compactly.

    ImageFolder keeps a (path, class) tuple per file, about 220 bytes each in Python objects (280 MB for
    ImageNet). Here: the paths relative to the split folder in one bytes object and the classes in one
    tensor, about 40 bytes a file, and the walk never holds more than one class folder's names at a time.
    DALI reads them from a list file (write_list), which costs it one copy of the names in C++; a Python
    list for `files=` cost 0.8 GB and 6 s more on ImageNet (argument copies in the pipeline's spec)."""

    def __init__(self, split_root: Path, classes: list[str]) -> None:
        self.root = str(split_root)
        root = os.fsencode(self.root)
        suffixes = tuple(os.fsencode(e) for e in IMG_EXTENSIONS)
        blob = bytearray()  # grown in place: no second copy of every name at its peak
        ends: list[np.ndarray] = []
        counts: list[int] = []
        for name in classes:
            names: list[bytes] = []
            # make_dataset: sorted(os.walk(class folder, followlinks=True)), sorted names, IMG_EXTENSIONS.
            for folder, _, files in sorted(os.walk(os.path.join(root, os.fsencode(name)), followlinks=True)):
                relative = os.path.relpath(folder, root)
                names.extend(os.path.join(relative, f) for f in sorted(files) if f.lower().endswith(suffixes))
            if not names:
                raise DataError(f"{os.path.join(self.root, name)} has no images ({', '.join(IMG_EXTENSIONS)})")
            counts.append(len(names))
            start = len(blob)
            blob += b"\0".join(names) + b"\0"
            ends.append(start + np.cumsum(np.fromiter(map(len, names), np.int64, len(names)) + 1))
        self._blob = blob
        self._ends = np.concatenate(ends)  # one past each name's separator
        self.targets = torch.repeat_interleave(torch.arange(len(classes)), torch.tensor(counts))

    def __len__(self) -> int:
        return len(self.targets)

    def relative(self, index: int) -> str:
        end = int(self._ends[index]) - 1
        start = int(self._ends[index - 1]) if index else 0
        return os.fsdecode(bytes(self._blob[start:end]))

    def path(self, index: int) -> str:
        return os.path.join(self.root, self.relative(index))

    def write_list(self, path: str, begin: int = 0, end: int | None = None) -> None:
        """DALI's `file_list` format, "relative/path label" a line, the label being the sample index; only
        the samples [begin, end) when given (their labels stay the indices in the whole split)."""
        if b"\n" in self._blob:
            raise DataError(f"{self.root} holds a file name with a line break, which DALI's file list cannot hold")
        end = len(self) if end is None else end
        with open(path, "wb") as out:
            chunk = 1 << 16
            for first in range(begin, end, chunk):
                last = min(first + chunk, end)
                start = int(self._ends[first - 1]) if first else 0
                names = bytes(self._blob[start : int(self._ends[last - 1]) - 1]).split(b"\0")
                out.write(b"".join(b"%s %d\n" % (n, first + i) for i, n in enumerate(names)))
