"""The smallest real Lightning fit, for tests of what imgcls adds to Lightning's loop (hook dispatch, the garbage
collector): a Linear(4, 2) trained by SGD on 12 random rows, batch 2, one epoch of 6 steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch


class TinyModule(L.LightningModule):
    """raise_at: the batch whose training step raises RuntimeError("step N")."""

    def __init__(self, raise_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.raise_at = raise_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.raise_at:
            raise RuntimeError(f"step {batch_idx}")
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def tiny_trainer(tmp_path: Path, callbacks: list[L.Callback]) -> L.Trainer:
    return L.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks, default_root_dir=tmp_path,
    )  # fmt: skip


def tiny_fit(trainer: L.Trainer, raise_at: int | None = None) -> None:
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 4)), batch_size=2)
    trainer.fit(TinyModule(raise_at), data)
