"""The torchvision path over shard files: the sampler that walks the epoch assignment (epoch_assignment.py) and the
dataset that reads it.

docs/shards.md "Distributed semantics" is the contract; in short:
- train, epoch e: shards in an order drawn from (seed, e), the records of each shard in an order drawn from
  (seed, e, shard); that stream cut into `world` contiguous ranges of q = total // (world * batch) * batch
  samples (equal batch counts on every rank, no DDP hang on uneven shards);
- val: the unshuffled stream cut into `world` contiguous ranges that differ by at most one sample;
- a rank's range is cut into one contiguous chunk of whole batches per DataLoader worker, so that each worker
  reads only the shards of its chunk (each whole, once), and the sampler yields the chunks' batches
  interleaved: batch k of the epoch is batch k // W of chunk k % W, which is exactly the batch the
  DataLoader hands to worker k % W (its round robin over workers of a map-style dataset).

Why a map-style dataset plus a sampler rather than an IterableDataset: the epoch, the resume position and
the per-sample augmentation seeds then live in the sampler in the main process, where Lightning's
set_epoch and its stateful-loader calls reach them (samplers.RankSampler / ResumableDataLoader, reused
as they are), and persistent workers see a new epoch without being restarted (an IterableDataset's copy in
a persistent worker never learns the epoch). Correctness never depends on which worker gets which batch:
only the number of shard reads does. A resume skips whole batches, so after it each worker again takes
one chunk (the DataLoader's round robin restarts at worker 0, the chunks rotate).

Sample identity (for the augmentation seed, seeding.sample_seed) is the record's position in the split's
shard list order: offset of its shard + its position in the shard, independent of epoch order, rank,
worker and resume.
"""

from __future__ import annotations

import bisect
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from imgcls.data.bad_images import BadImage, BadImageLog, BadSample
from imgcls.data.images import load_rgb
from imgcls.data.shards import remote
from imgcls.data.shards.epoch_assignment import epoch_assignment, loader_order
from imgcls.data.shards.formats import read_boxed_records
from imgcls.data.shards.manifest import ShardSet
from imgcls.data.tf_crop import OBJECT_BOXES_INFO
from imgcls.data.torchvision.samplers import RankSampler
from imgcls.errors import DataError, UserError
from imgcls.seeding import seeded


class ShardStreamSampler(RankSampler):
    """RankSampler over the epoch assignment: the same epoch, resume and per-sample-seed machinery, with the
    indices (sample ids) in the assignment's order instead of a global permutation."""

    def __init__(
        self,
        counts: Sequence[int],
        rank: int,
        world_size: int,
        batch_size: int,
        workers: int,
        training: bool,
        seed: int,
    ) -> None:
        super().__init__(
            int(sum(counts)), rank, world_size, shuffle=training, seed=seed, drop_last=training,
            per_sample_seeds=training,
        )  # fmt: skip
        self.counts = [int(c) for c in counts]
        self.batch_size = int(batch_size)
        self.workers = int(workers)
        self._cached: tuple[int, list[int]] | None = None

    def _indices(self) -> list[int]:
        if self._cached is None or self._cached[0] != self.epoch:  # len() and iter() ask for the same epoch
            assignment = epoch_assignment(
                self.counts, self.world_size, self.rank, self.batch_size, self.workers, self.seed, self.epoch,
                self.shuffle,
            )  # fmt: skip
            self._cached = (self.epoch, loader_order(assignment, self.batch_size).tolist())
        return self._cached[1]


# --- reading shards ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused(BadSample):
    """Not a bad image but a mistake the run must stop for (a label outside the classes, an unreadable
    shard): decided in the main process, where the error stays one line (see bad_images.py)."""


class StopOnRefused:
    """The loader's bad-sample sink: raises for a Refused sample, hands bad images to the run's BadImageLog."""

    def __init__(self, log: BadImageLog) -> None:
        self.log = log

    def record(self, bad: list[BadSample]) -> None:
        for sample in bad:
            if isinstance(sample, Refused):
                raise DataError(sample.reason)
        self.log.record(bad)


class ShardRecords(Dataset):
    """Map-style dataset over a split's shard files: index = sample id (or (id, augmentation seed)).

    A worker reads a shard whole (one sequential read of the local file or its cached copy) when it first
    needs one of its records, and keeps the last shard read: the assignment gives each worker its shards in turn."""

    def __init__(
        self,
        shard_set: ShardSet,
        split: str,
        transform: Callable[[Any], Any],
        cache_dir: str | None,
        storage_options: dict[str, Any] | None = None,
        object_boxes: bool = False,
    ) -> None:
        """object_boxes: each image carries its record's object boxes to the transform (PIL info
        tf_crop.OBJECT_BOXES_INFO: TF1's crop covers one of them); False: none (the crop's box is the image)."""
        shards = shard_set.splits[split]
        self.urls = [s.url for s in shards]
        self.offsets = [0, *np.cumsum([s.count for s in shards]).tolist()]
        self.fmt = shard_set.format
        self.label = shard_set.label  # stored label -> 0..N-1, or a DataError naming data.label_base
        self.transform = transform
        self.cache_dir, self.storage_options = cache_dir, dict(storage_options or {})
        self.object_boxes = object_boxes
        self._shard: tuple[int, list[tuple[bytes, int, str, np.ndarray | None]]] | None = None

    def __len__(self) -> int:
        return self.offsets[-1]

    def locate(self, sample_id: int) -> tuple[int, int]:
        shard = bisect.bisect_right(self.offsets, sample_id) - 1
        return shard, sample_id - self.offsets[shard]

    def records(self, shard: int) -> list[tuple[bytes, int, str, np.ndarray | None]]:
        if self._shard is None or self._shard[0] != shard:
            self._shard = None  # the previous shard's bytes go before the next one is read
            url = self.urls[shard]
            path = remote.local_copy(url, self.cache_dir, self.storage_options)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                raise DataError(f"cannot read shard {url}: {exc.strerror or type(exc).__name__}") from None
            records = list(read_boxed_records(self.fmt, data, url))
            expected = self.offsets[shard + 1] - self.offsets[shard]
            if len(records) != expected:
                raise DataError(f"shard {url} holds {len(records)} records, its listing says {expected}")
            self._shard = (shard, records)
        return self._shard[1]

    def __getitem__(self, index: int | tuple[int, int]) -> Any:
        seed = None
        if isinstance(index, tuple):  # (id, augmentation seed) from RankSampler(per_sample_seeds=True)
            index, seed = index
        shard, position = self.locate(int(index))
        try:
            encoded, stored, name, boxes = self.records(shard)[position]
        except UserError as exc:  # in a worker: comes back as a marker, raised in one line by the loader
            return Refused(self.urls[shard], str(exc))
        where = f"{self.urls[shard]}:{name}"
        try:
            label = self.label(stored, where)
        except UserError as exc:
            return Refused(where, str(exc))
        try:
            image = load_rgb(io.BytesIO(encoded))  # PIL opens a file object as a path
        except BadImage as exc:
            return BadSample(where, str(exc))
        if self.object_boxes and boxes is not None:
            image.info[OBJECT_BOXES_INFO] = boxes
        if seed is None:
            return self.transform(image), label
        with seeded(seed):
            return self.transform(image), label
