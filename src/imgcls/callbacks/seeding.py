"""The seeding callbacks of a training run: RankSeed (seed + global rank, once the rank is known) and RNGState
(every rank's RNG states in the checkpoint). Why each exists and the order they act in: imgcls/seeding.py."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states

from imgcls.distributed import gather_objects
from imgcls.seeding import rank_seed

log = logging.getLogger(__name__)


class RankSeed(L.Callback):
    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        seed = rank_seed(self.seed, trainer.global_rank)
        # workers=True: dataloader workers derive their seeds from this one (and their worker id).
        L.seed_everything(seed, workers=True, verbose=False)
        log.info("global rank %d of %d: seed %d", trainer.global_rank, trainer.world_size, seed)


class RNGState(L.Callback):
    def __init__(self) -> None:
        self._loaded: list[dict[str, Any]] | None = None

    def state_dict(self) -> dict[str, Any]:
        # Called on every rank while a checkpoint is assembled; rank 0 writes the gathered list.
        states = _collect_rng_states(include_cuda=torch.cuda.is_available())
        # Lightning loads checkpoints with torch.load(weights_only=True), which refuses numpy arrays.
        name, keys, pos, has_gauss, gauss = states["numpy"]
        states["numpy"] = (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
        return {"ranks": gather_objects(states)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = list(state_dict.get("ranks") or [])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Applied here, after everything the restore does, right before the first resumed batch.
        if self._loaded:
            if len(self._loaded) != trainer.world_size:
                log.warning(
                    "resuming %d ranks from %d: RNG streams differ from an uninterrupted run",
                    trainer.world_size,
                    len(self._loaded),
                )
            states = dict(self._loaded[trainer.global_rank % len(self._loaded)])
            name, keys, pos, has_gauss, gauss = states["numpy"]
            states["numpy"] = (name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss)
            _set_rng_states(states)
            self._loaded = None
