"""A sharding sampler for training and exact validation.

Hand-written because torch's DistributedSampler pads the val set with duplicates (so top-1 depends on
the world size) and cannot resume inside an epoch. This one shards without padding when asked
(validation), drops the tail evenly when asked (training, so all ranks take the same number of
steps), reshuffles per epoch from (seed, epoch), and saves its position for mid-epoch resume.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler


class ShardSampler(Sampler[int]):
    def __init__(
        self,
        num_samples: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        self.num_samples_total = num_samples
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

    def __iter__(self) -> Iterator[int]:
        indices = self._indices()[self._skip :]
        self._skip = 0
        return iter(indices)

    def __len__(self) -> int:
        return len(self._indices())

    def state_dict(self, consumed: int) -> dict[str, Any]:
        return {"epoch": self.epoch, "consumed": consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self._skip = int(state["consumed"])
