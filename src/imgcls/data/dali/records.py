"""DALI's readers for shard files (data.format=tfrecord|webdataset): what the pipeline needs to read them
and what the loader needs to make sense of what it read.

The folder reader's "label" is a sample index that the loader maps to a class (file_list.FileList). DALI's
shard readers have no sample index, so each record is named by a key the pipeline builds from DALI's own
`source_info` property of the encoded image ("PATH at index OFFSET" for TFRecord, "PATH:OFFSET:MEMBER"
for WebDataset): (hash of the shard path, byte offset, stored label), three int64. `ShardCatalog` turns
keys into labels (stored - label_base, range-checked), bad-record names and trace lines. The keys are made
in the same per-batch `fn.python_function` that checks the encoded bytes (pipelines.check_tfrecord,
check_webdataset), so the reader adds no Python call of its own; the WebDataset `.cls` member (ASCII
digits) is parsed there too. Hand-written because DALI has no operator that parses a decimal string or hashes a string.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tarfile
from functools import lru_cache

import numpy as np
import torch

from imgcls.data.bad_images import BadSample
from imgcls.data.image_scan import scan_bytes
from imgcls.data.shards import tfrecord, webdataset
from imgcls.data.shards.manifest import ShardSet
from imgcls.errors import DataError

# A shard reader's shuffle buffer (fn.readers.*(random_shuffle=True, initial_fill=...)): DALI's default of
# 1,024 records, about 110 MB of encoded ImageNet JPEGs per rank (docs/data-backends.md "Startup" measured
# that buffer for the folder reader). DALI picks each record uniformly among the buffered records of the
# current epoch only (its Loader keeps one buffer segment per epoch), so an epoch never repeats or borrows a
# record whatever the size; the size bounds how far a record moves: it comes out at most `initial_fill`
# places before its place in the rank's range. The shards come shuffled (the converter and TF1's
# build_imagenet_data.py both shuffle the whole split before writing its shards), so the buffer only has to
# vary the order between epochs, not mix classes. Capped to a rank's records: more would only be read ahead.
SHUFFLE_FILL = 1024
BAD_LABEL = np.iinfo(np.int64).min  # a .cls member that is not a whole number; ShardCatalog reports it


def shuffle_fill(records_per_rank: int) -> int:
    return max(1, min(SHUFFLE_FILL, records_per_rank))


@lru_cache(maxsize=4096)
def path_hash(path: str) -> int:
    """A shard path as a signed 64-bit int (the first 8 bytes of its blake2b): what the key carries."""
    return int.from_bytes(hashlib.blake2b(path.encode(), digest_size=8).digest(), "little", signed=True)


def _source(info: np.ndarray, fmt: str) -> tuple[int, int]:
    """(path hash, byte offset) of DALI's source_info for a record."""
    text = bytes(info).decode(errors="surrogateescape")
    if fmt == "tfrecord":  # "PATH at index OFFSET"
        path, _, offset = text.rpartition(" at index ")
    else:  # "PATH:OFFSET:MEMBER"
        path, offset, _ = text.rsplit(":", 2)
    return path_hash(path), int(offset)


def tfrecord_keys(infos: list[np.ndarray], labels: list[np.ndarray]) -> list[np.ndarray]:
    """The keys of a TFRecord batch: DALI's source_info and the image/class/label feature of each record."""
    return [np.array([*_source(i, "tfrecord"), int(lab.reshape(-1)[0])], np.int64) for i, lab in zip(infos, labels)]


def _parse_cls(data: np.ndarray) -> int:
    try:
        return int(bytes(data).decode("ascii").strip())
    except ValueError:  # not ASCII digits: reported by ShardCatalog.labels with the record's name
        return int(BAD_LABEL)


def webdataset_keys(infos: list[np.ndarray], cls: list[np.ndarray]) -> list[np.ndarray]:
    """The keys of a WebDataset batch, the label parsed from the ASCII `.cls` member."""
    return [np.array([*_source(i, "webdataset"), _parse_cls(c)], np.int64) for i, c in zip(infos, cls)]


class ShardCatalog:
    """The loader's view of one split's shard files (the local paths DALI reads): keys -> labels, names."""

    def __init__(self, shards: ShardSet, split: str, local_paths: list[str]) -> None:
        self.shards = shards
        self.split = split
        self.paths = list(local_paths)
        self.total = shards.count(split)
        self._path_of = {path_hash(p): p for p in self.paths}
        if len(self._path_of) != len(self.paths):  # a 64-bit hash collision, or one file listed twice
            raise DataError(f"{split} lists a shard file twice: {sorted(self.paths)}")

    def __len__(self) -> int:
        return self.total

    def name(self, key: torch.Tensor | list[int]) -> str:
        shard, offset = int(key[0]), int(key[1])
        return f"{self._path_of.get(shard, '?')} (record at byte {offset})"

    def labels(self, keys: torch.Tensor) -> torch.Tensor:
        """stored - label_base; a label outside the classes is a one-line DataError naming data.label_base."""
        stored = keys[:, 2]
        labels = stored - self.shards.label_base
        wrong = (labels < 0) | (labels >= len(self.shards.classes))
        if bool(wrong.any()):
            first = int(torch.nonzero(wrong)[0, 0])
            if int(stored[first]) == BAD_LABEL:
                raise DataError(f"{self.name(keys[first])}: the .cls member is not a whole number")
            self.shards.label(int(stored[first]), self.name(keys[first]))  # raises, with the allowed range
        return labels

    def bad_samples(self, keys: torch.Tensor) -> list[BadSample]:
        """The records the pipeline flagged, named `<shard file>:<record name>` as the torchvision path names
        them (the record's image/filename or tar key; else its byte offset), with the reason. Both are found
        again by reading that one record: a bad record is rare, and the pipeline kept only a placeholder."""
        bad = []
        for key in keys:
            path, offset = self._path_of.get(int(key[0]), "?"), int(key[1])
            name, reason = self._reread(path, offset)
            bad.append(BadSample(f"{path}:{name}" if name else self.name(key), reason or "not decodable by DALI"))
        return bad

    def _reread(self, path: str, offset: int) -> tuple[str | None, str | None]:
        """(record name, image_scan.scan_bytes reason) of the record at `offset` (DALI's source_info). A length
        field (TFRecord) or member size (tar) past the file's end is a DataError, checked before the read: DALI
        read the record by its index, so it is the shard that is broken, and the read would allocate it."""
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if self.shards.format == "tfrecord":  # offset: the record's length field
                    f.seek(offset)
                    (length,) = struct.unpack("<Q", f.read(8))
                    f.seek(4, os.SEEK_CUR)  # the length's checksum
                    tfrecord.check_length(path, None, offset, length, size)
                    try:
                        image, _, name, _ = tfrecord.decode_example(f.read(length), path)
                    except DataError:
                        return None, None  # DALI parsed it, we cannot: the warning names it by its offset
                else:  # offset: the member's data, after its 512-byte tar header
                    f.seek(offset - tarfile.BLOCKSIZE)
                    member = tarfile.TarInfo.frombuf(f.read(tarfile.BLOCKSIZE), "utf-8", "surrogateescape")
                    if member.size > size - offset:
                        raise DataError(
                            f"{path}: truncated or corrupt tar (the member at byte {offset} has size {member.size}, "
                            f"more than the {max(size - offset, 0)} bytes left in the file)"
                        )
                    image, name = f.read(member.size), webdataset.split_name(member.name)[0]
        except (OSError, ValueError, struct.error, tarfile.TarError):
            return None, None
        return name, scan_bytes(image)

    def trace_tokens(self, keys: torch.Tensor) -> list[str]:
        """'SHARD_FILE_NAME@OFFSET' per record (data.trace_dir)."""
        return [f"{os.path.basename(self._path_of.get(int(k[0]), '?'))}@{int(k[1])}" for k in keys]
