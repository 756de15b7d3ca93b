"""RankSampler: each rank's part of the samples, for training and exact validation.

Hand-written because torch's DistributedSampler pads the val set with duplicates (so top-1 depends on
the world size) and cannot resume inside an epoch. This one splits the samples among the ranks without
padding when asked (validation), drops the tail evenly when asked (training, so all ranks take the same
number of steps), reshuffles per epoch from (seed, epoch), and saves its position for mid-epoch resume.
("Shard" in imgcls means a file of records, data/shards/; a rank's part of the samples is its part.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from imgcls.data.bad_images import equal_step_counts
from imgcls.data.device_prefetch import one_batch_ahead
from imgcls.seeding import sample_seeds


class RankSampler(Sampler[Any]):
    def __init__(
        self,
        num_samples: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        per_sample_seeds: bool = False,
    ) -> None:
        self.num_samples_total = num_samples
        # Yield (index, seed of that sample's augmentation) pairs: seeding.py item 3.
        self.per_sample_seeds = per_sample_seeds
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._skip = 0  # samples of the current epoch already consumed (mid-epoch resume)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._skip = 0
        self.epoch = epoch

    def _indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples_total, generator=g).tolist()
        else:
            order = list(range(self.num_samples_total))
        if self.drop_last:
            order = order[: len(order) - len(order) % self.world_size]
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[Any]:
        indices = self._indices()[self._skip :]
        self._skip = 0
        if self.per_sample_seeds:  # the epoch's seeds in one vectorized pass, not a Python call per sample
            return zip(indices, sample_seeds(self.seed, self.epoch, indices).tolist())
        return iter(indices)

    def __len__(self) -> int:
        return len(self._indices())

    @property
    def pending_skip(self) -> int:
        """Samples the next __iter__ will skip (set by load_state_dict)."""
        return self._skip

    def state_dict(self, consumed: int) -> dict[str, Any]:
        return {"epoch": self.epoch, "consumed": consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        epoch, consumed = int(state["epoch"]), int(state["consumed"])
        if consumed >= len(self._indices()):
            # Saved at the end of an epoch: the next epoch starts from its beginning. Lightning creates the
            # resumed iterator before it calls set_epoch, so the epoch must already be the next one here.
            epoch, consumed = epoch + 1, 0
        self.epoch, self._skip = epoch, consumed


class ResumableDataLoader(DataLoader):
    """A DataLoader that Lightning resumes mid-epoch: having state_dict/load_state_dict makes it "stateful"
    to Lightning 2.6, which stores state_dict() in the checkpoint (fit_loop "combined_loader") and calls
    load_state_dict() before creating the resumed epoch's iterator (FitLoop.setup_data).

    The position is counted in batches handed to Lightning (its fetcher does not prefetch from a sized
    loader), not in indices taken from the sampler (worker prefetching runs ahead). The collate returns
    (images, labels, bad samples); bad samples go to `bad_images` here, in the main process.
    """

    def __init__(self, *args: Any, bad_images: Any = None, copier: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bad_images = bad_images
        # On a GPU: batches copied one step ahead on a side stream (data/device_prefetch.py); None: Lightning copies.
        self.copier = copier
        self._consumed = 0  # samples of the current epoch taken from the workers, including a resumed skip
        self._position = 0  # ... up to the last batch handed to the trainer (what a checkpoint records)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # Lightning swaps in a SequentialSampler for trainer.overfit_batches: nothing to resume there.
        self._consumed = self._position = getattr(self.sampler, "pending_skip", 0)
        refill = self.drop_last and getattr(self.sampler, "world_size", 1) > 1  # training under DDP
        batches: Iterator[tuple[tuple[Any, Any], int]] = (
            (batch, self._consumed) for batch in equal_step_counts(self._usable_batches(), refill)
        )
        if self.copier is not None:
            batches = one_batch_ahead(batches, self.copier.stage, self.copier.hand_over)
        for batch, position in batches:
            self._position = position
            yield batch

    def _usable_batches(self) -> Iterator[tuple[Any, Any] | None]:
        for images, labels, bad in super().__iter__():
            self._consumed += self.batch_size or 0
            if bad and self.bad_images is not None:
                self.bad_images.record(bad)
            # A batch left empty by bad files is not usable; in training (drop_last) neither is one left
            # with a single sample, which BatchNorm cannot normalize (only possible with tiny batches).
            yield (images, labels) if len(labels) >= (2 if self.drop_last else 1) else None

    def state_dict(self) -> dict[str, Any]:
        if not isinstance(self.sampler, RankSampler):
            return {}
        return self.sampler.state_dict(self._position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if isinstance(self.sampler, RankSampler) and state:
            self.sampler.load_state_dict(state)
