"""The LightningDataModule: one interface over every data backend."""

from __future__ import annotations

from typing import Any

import lightning as L

from imgcls.data.backends import make_backend
from imgcls.data.demo import ensure_demo_dataset


class ClassificationDataModule(L.LightningDataModule):
    """Builds the backend at construction (so the class list is known before the model is built)."""

    def __init__(self, cfg: Any, batch_size: int, seed: int = 0) -> None:
        super().__init__()
        if cfg.name == "demo":
            ensure_demo_dataset(cfg.root)
        self.cfg = cfg
        self.batch_size = batch_size
        self.val_batch_size = int(cfg.val_batch_size or batch_size)
        self.seed = seed
        self.backend = make_backend(cfg)

    @property
    def classes(self) -> list[str]:
        return list(self.backend.classes)

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> Any:
        rank, world = self._rank_world()
        return self.backend.loader("train", self.batch_size, rank, world, self.seed)

    def val_dataloader(self) -> Any:
        rank, world = self._rank_world()
        return self.backend.loader("val", self.val_batch_size, rank, world, self.seed)
