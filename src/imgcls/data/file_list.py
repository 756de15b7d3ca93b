"""A split's files in ImageFolder's order and labels, held compactly: the torchvision dataset's samples and DALI's
file_list, listed by one rank under DDP (distributed.made_once)."""

from __future__ import annotations

import bisect
import os
import zlib
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets.folder import IMG_EXTENSIONS

from imgcls.data.bad_images import BadSample
from imgcls.data.image_scan import scan_file
from imgcls.errors import DataError

BLOCK = 4096  # names per compressed block: a path lookup decompresses one block (about 130 KB, 0.1 ms)


class FileList:
    """A split's files in ImageFolder's order (torchvision's make_dataset walk, reproduced), held compactly.

    ImageFolder keeps a (path, class) tuple per file, about 220 bytes each in Python objects (280 MB for
    ImageNet). DALI keeps its own copy of every name once it has read the list (write_list), so this one only
    serves the rare lookups (a bad file's path) and the next list file: the names are kept zlib-compressed in
    blocks of BLOCK, about 3 bytes a file on ImageNet (4 MB, against 40 MB as one byte string and 280 MB as
    ImageFolder's tuples), and the classes as one boundary per class (a label is a binary search). The walk
    never holds more than one class folder's names uncompressed. A Python list for DALI's `files=` cost 0.8
    GB and 6 s more on ImageNet (argument copies in the pipeline's spec)."""

    def __init__(self, split_root: Path, classes: list[str]) -> None:
        self.root = str(split_root)
        self.classes = list(classes)
        root = os.fsencode(self.root)
        suffixes = tuple(os.fsencode(e) for e in IMG_EXTENSIONS)
        self._blocks: list[bytes] = []
        pending: list[bytes] = []  # names not yet in a block (fewer than BLOCK)
        counts: list[int] = []
        newline = False
        for name in classes:
            names: list[bytes] = []
            # make_dataset: sorted(os.walk(class folder, followlinks=True)), sorted names, IMG_EXTENSIONS.
            for folder, _, files in sorted(os.walk(os.path.join(root, os.fsencode(name)), followlinks=True)):
                relative = os.path.relpath(folder, root)
                names.extend(os.path.join(relative, f) for f in sorted(files) if f.lower().endswith(suffixes))
            if not names:
                raise DataError(f"{os.path.join(self.root, name)} has no images ({', '.join(IMG_EXTENSIONS)})")
            newline = newline or any(b"\n" in n for n in names)
            counts.append(len(names))
            pending.extend(names)
            while len(pending) >= BLOCK:
                self._blocks.append(zlib.compress(b"\0".join(pending[:BLOCK]), 1))
                del pending[:BLOCK]
        if pending:
            self._blocks.append(zlib.compress(b"\0".join(pending), 1))
        self._newline = newline
        self._class_ends = torch.tensor(np.cumsum(counts), dtype=torch.int64)  # one past each class's last file
        self._class_ends_list = self._class_ends.tolist()  # for one label at a time without torch (label)

    def __len__(self) -> int:
        return int(self._class_ends[-1])

    def labels(self, indices: torch.Tensor) -> torch.Tensor:
        """The classes (int64) of the sample indices."""
        return torch.searchsorted(self._class_ends, indices, right=True)

    def label(self, index: int) -> int:
        """The class of one sample index (a binary search over the class boundaries)."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        return bisect.bisect_right(self._class_ends_list, index)

    @property
    def targets(self) -> torch.Tensor:
        """Every file's class, in order (built on each call: 8 bytes a file)."""
        return self.labels(torch.arange(len(self)))

    def bad_samples(self, indices: torch.Tensor) -> list[BadSample]:
        """The files the pipeline flagged; the reason is found again here (a bad file is rare)."""
        paths = [self.path(i) for i in indices.tolist()]
        return [BadSample(p, scan_file(p) or "not decodable by DALI") for p in paths]

    def trace_tokens(self, indices: torch.Tensor) -> list[str]:
        """The sample indices, for data.trace_dir."""
        return [str(i) for i in indices.tolist()]

    def _block(self, b: int) -> list[bytes]:
        return zlib.decompress(self._blocks[b]).split(b"\0")

    def relative(self, index: int) -> str:
        if not 0 <= index < len(self):
            raise IndexError(index)
        return os.fsdecode(self._block(index // BLOCK)[index % BLOCK])

    def path(self, index: int) -> str:
        return os.path.join(self.root, self.relative(index))

    def write_list(self, path: str, begin: int = 0, end: int | None = None, order: np.ndarray | None = None) -> None:
        """DALI's `file_list` format, "relative/path label" a line, the label being the sample index; only
        the samples [begin, end) when given (their labels stay the indices in the whole split). `order`: a
        permutation of all the indices, to write the lines in that order instead (begin/end not allowed)."""
        if self._newline:
            raise DataError(f"{self.root} holds a file name with a line break, which DALI's file list cannot hold")
        end = len(self) if end is None else end
        with open(path, "wb") as out:
            if order is None:
                for b in range(begin // BLOCK, (end + BLOCK - 1) // BLOCK):
                    first = b * BLOCK
                    names = self._block(b)[max(begin - first, 0) : end - first]
                    first = max(first, begin)
                    out.write(b"".join(b"%s %d\n" % (n, first + i) for i, n in enumerate(names)))
                return
            if begin != 0 or end != len(self) or len(order) != len(self):
                raise ValueError("order: a permutation of the whole list")
            # Random access: every name uncompressed at once (one byte string, 40 MB on ImageNet), for
            # this call only; the permuted lines go out in chunks.
            blob = b"\0".join(zlib.decompress(block) for block in self._blocks) + b"\0"
            ends = np.flatnonzero(np.frombuffer(blob, np.uint8) == 0)
            for first in range(0, len(order), 1 << 16):
                chunk = np.asarray(order[first : first + (1 << 16)], np.int64)
                starts = np.where(chunk > 0, ends[chunk - 1] + 1, 0).tolist()
                lines = zip(starts, ends[chunk].tolist(), chunk.tolist())
                out.write(b"".join(b"%s %d\n" % (blob[s:e], i) for s, e, i in lines))
