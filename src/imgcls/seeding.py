"""Every seeding decision of a training run, in one place.

1. `seed_for_init(seed)` before the model is built: identical initial weights on every rank (DDP also
   broadcasts rank 0's weights, but BN buffers, EMA copies and anything built before the process
   group exists must agree too).
2. `RankSeed` reseeds with `seed + global_rank` once the rank is known, so that augmentation, mixup
   and dropout differ between ranks and nodes (NVIDIA seeded by local rank, so nodes repeated each
   other's random streams). Data order is not affected: the samplers shuffle from (data seed, epoch).

RankSeed runs in `setup`, i.e. before Lightning restores a checkpoint: RNG state saved in a checkpoint
(resume) is restored afterwards and wins.
"""

from __future__ import annotations

import logging

import lightning as L

log = logging.getLogger(__name__)


def rank_seed(seed: int, global_rank: int) -> int:
    return seed + global_rank


def seed_for_init(seed: int) -> None:
    L.seed_everything(seed, workers=True, verbose=False)


class RankSeed(L.Callback):
    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        seed = rank_seed(self.seed, trainer.global_rank)
        # workers=True: dataloader workers derive their seeds from this one (and their worker id).
        L.seed_everything(seed, workers=True, verbose=False)
        log.info("global rank %d of %d: seed %d", trainer.global_rank, trainer.world_size, seed)
