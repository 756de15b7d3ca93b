"""The epoch assignment over shard files (pure functions): which records each rank and DataLoader worker reads, in
which order, for an epoch; docs/shards.md "Distributed semantics" is the contract, data/shards/stream.py walks it.

- train, epoch e: shards in an order drawn from (seed, e), the records of each shard in an order drawn from
  (seed, e, shard); that stream cut into `world` contiguous ranges of q = total // (world * batch) * batch
  samples (equal batch counts on every rank, no DDP hang on uneven shards);
- val: the unshuffled stream cut into `world` contiguous ranges that differ by at most one sample;
- a rank's range is cut into one contiguous chunk of whole batches per DataLoader worker, so that each worker
  reads only the shards of its chunk (each whole, once); `loader_order` interleaves the chunks' batches the way
  the DataLoader's round robin hands them to workers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def shard_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    # numpy's SeedSequence over (seed, epoch): once per epoch, so its cost does not matter here.
    return np.random.default_rng([int(seed), int(epoch)]).permutation(num_shards)


def record_order(count: int, seed: int, epoch: int, shard: int) -> np.ndarray:
    return np.random.default_rng([int(seed), int(epoch), int(shard)]).permutation(count)


def rank_range(total: int, world: int, rank: int, batch_size: int, training: bool) -> tuple[int, int]:
    """[start, stop) of this rank in the epoch's stream."""
    if training:
        q = total // (world * batch_size) * batch_size
        return rank * q, (rank + 1) * q
    return total * rank // world, total * (rank + 1) // world


def worker_chunks(start: int, stop: int, batch_size: int, workers: int) -> list[tuple[int, int]]:
    """The stream range [start, stop) cut into one contiguous range of whole batches per worker (indexed by
    worker). The first n % W chunks take one batch more, and the chunk that holds the final (maybe partial)
    batch is the last in the stream, so the interleaved order has the partial batch last."""
    w = max(1, int(workers))
    n = math.ceil((stop - start) / batch_size)
    sizes = [n // w + (1 if c < n % w else 0) for c in range(w)]
    last = (n - 1) % w
    ranges: list[tuple[int, int]] = [(0, 0)] * w
    at = start
    for c in [c for c in range(w) if c != last] + [last]:
        end = min(stop, at + sizes[c] * batch_size)
        ranges[c] = (at, end)
        at = end
    return ranges


def stream_ids(counts: Sequence[int], start: int, stop: int, seed: int, epoch: int, training: bool) -> np.ndarray:
    """Sample ids (shard offset + record position, in the shard list's order) at stream positions [start, stop)."""
    sizes = np.asarray(counts, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    order = shard_order(len(sizes), seed, epoch) if training else np.arange(len(sizes))
    ends = np.cumsum(sizes[order])  # stream position where each shard (in stream order) ends
    parts = []
    first = int(np.searchsorted(ends, start, side="right"))
    for k in range(first, len(order)):
        begin = int(ends[k] - sizes[order[k]])
        if begin >= stop:
            break
        shard = int(order[k])
        lo, hi = max(start, begin) - begin, min(stop, int(ends[k])) - begin
        positions = record_order(int(sizes[shard]), seed, epoch, shard)[lo:hi] if training else np.arange(lo, hi)
        parts.append(offsets[shard] + positions)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def epoch_assignment(
    counts: Sequence[int],
    world: int,
    rank: int,
    batch_size: int,
    workers: int,
    seed: int,
    epoch: int,
    training: bool,
) -> list[np.ndarray]:
    """For each DataLoader worker (num_workers=0: one), the sample ids of its chunk in reading order."""
    start, stop = rank_range(int(sum(counts)), world, rank, batch_size, training)
    return [stream_ids(counts, a, b, seed, epoch, training) for a, b in worker_chunks(start, stop, batch_size, workers)]


def loader_order(chunks: Sequence[np.ndarray], batch_size: int) -> np.ndarray:
    """The sampler's order: batch k is batch k // W of chunk k % W (the DataLoader's round robin)."""
    batches = [[c[i : i + batch_size] for i in range(0, len(c), batch_size)] for c in chunks]
    rounds = max((len(b) for b in batches), default=0)
    out = [b[r] for r in range(rounds) for b in batches if r < len(b)]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
