"""Every seeding decision of a training run, in one place.

1. `seed_for_init(seed)` before the model is built: identical initial weights on every rank (DDP also
   broadcasts rank 0's weights, but BN buffers, EMA copies and anything built before the process
   group exists must agree too).
2. `RankSeed` (callbacks/seeding.py) reseeds with `seed + global_rank` once the rank is known, so that
   augmentation, mixup and dropout differ between ranks and nodes (NVIDIA seeded by local rank, so nodes repeated each
   other's random streams). Data order is not affected: the samplers shuffle from (data seed, epoch).

3. `sample_seed(seed, epoch, index)` seeds the augmentation of each training image (torchvision
   backend): a sample's crop and flip depend on nothing else, not on the number of DataLoader workers,
   the rank that reads it, or where a resumed epoch restarted. That is what makes a mid-epoch resume
   bitwise exact with worker processes too (a worker's RNG state cannot be saved in a checkpoint).

4. `dali_pipeline_seed(seed, rank, epoch)`: each rank's DALI pipeline seed; with `dali_list_order`, from the epoch
   the pipeline is built for (a progressive-resizing stage's first epoch; 0 otherwise), so that each stage's
   new pipeline does not repeat the first stage's order and augmentation draws.
5. `RNGState` (callbacks/seeding.py): the global RNG states (torch, CUDA, numpy, python) of every rank travel in
   the checkpoint, so a resumed run draws the same augmentations and mixup lambdas as an uninterrupted one.
   Hand-written: Lightning 2.6 restores model, optimizer, schedulers, loops and stateful loaders, but not RNG
   states.

RankSeed runs in `setup`, i.e. before Lightning restores a checkpoint: RNG state saved in a checkpoint
(resume) is restored afterwards and wins.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import lightning as L
import numpy as np
import torch


def rank_seed(seed: int, global_rank: int) -> int:
    return seed + global_rank


def seed_for_init(seed: int) -> None:
    L.seed_everything(seed, workers=True, verbose=False)


_MASK64 = (1 << 64) - 1


def _splitmix64(x: Any) -> Any:
    """splitmix64 of a Python int, or of each element of a numpy uint64 array (numpy's uint64 arithmetic wraps modulo
    2^64 by itself; the masks keep Python's ints there)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seeds(seed: int, epoch: int, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """sample_seed of each index, for a whole epoch at once: the RankSampler hands these out in the main process,
    where a Python call per sample would cost the training thread ~1 us each."""
    head = _splitmix64(_splitmix64(int(seed)) ^ int(epoch))
    return _splitmix64(head ^ np.asarray(indices, dtype=np.uint64)) & 0xFFFFFFFF


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A well-mixed 32-bit seed for one sample of one epoch: splitmix64 chained over the three numbers
    (an order of magnitude cheaper than numpy's SeedSequence, which cost seconds per rank and epoch on ImageNet)."""
    return _splitmix64(_splitmix64(_splitmix64(int(seed)) ^ int(epoch)) ^ int(index)) & 0xFFFFFFFF


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a transform with Python's, numpy's and torch's CPU RNGs seeded (timm's and torchvision's
    transforms draw from all three). In a DataLoader worker the global streams are the worker's own; in
    the main process (num_workers=0) they are restored afterwards, so mixup and dropout keep theirs."""
    in_worker = torch.utils.data.get_worker_info() is not None
    saved = None if in_worker else (random.getstate(), np.random.get_state(), torch.get_rng_state())
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)  # the CPU generator only: CUDA streams are not touched
    try:
        yield
    finally:
        if saved is not None:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


def dali_pipeline_seed(seed: int, rank: int, epoch: int = 0) -> int:
    # Distinct per rank (unlike NVIDIA's fixed 12 + device_id) and derived from the run seed.
    return (int(seed) * 1000003 + 7919 * int(rank) + 104729 * int(epoch)) % (2**31 - 1)


def dali_list_order(seed: int, size: int, epoch: int = 0) -> np.ndarray:
    """The order of the train list handed to DALI: a permutation of range(size) from the run seed alone,
    the same on every rank (DALI's per-epoch shuffle has a fixed seed: this makes the order the run seed's)."""
    return np.random.default_rng(_splitmix64((int(seed) ^ 0x44414C49) + (int(epoch) << 32))).permutation(size)
