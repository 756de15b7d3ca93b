"""FiniteLoss's periodic check is read one period after it starts (no host sync on the step path): what that leaves
of docs/reliability.md's promises. A NaN is found at the latest 2 * K optimizer steps later, and never saved: a
checkpoint save reads the pending check first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from imgcls.callbacks.finite_loss import FiniteLoss
from imgcls.errors import TrainingError

K = 4  # FiniteLoss's period here
NAN_AT = 2  # the optimizer step (global_step before it) whose reported loss is NaN


class Net(L.LightningModule):
    """The loss it trains on stays finite (so do the weights); the loss it reports for step NAN_AT is NaN. Only
    FiniteLoss's reading of the reported losses can find it, not the save's check of the weights."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, i: int) -> dict[str, torch.Tensor]:
        loss = self.layer(batch[0]).pow(2).mean()
        reported = loss.detach() * float("nan") if self.global_step == NAN_AT else loss.detach()
        return {"loss": loss, "loss_value": reported}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)))
        return torch.utils.data.DataLoader(data, batch_size=2)


class SaveAt(L.Callback):
    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def fit(tmp_path: Path, *callbacks: L.Callback) -> None:
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=30, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[FiniteLoss(tmp_path / "last.ckpt", every_n_steps=K), *callbacks],
    )  # fmt: skip
    trainer.fit(Net())


def test_a_nan_is_found_at_the_check_after_the_one_that_saw_it(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match=f"train.loss is nan at step {NAN_AT} .* found at step {2 * K},"):
        fit(tmp_path)


def test_a_save_between_the_checks_reads_the_pending_one_first(tmp_path: Path) -> None:
    """The check at step K has seen the NaN and waits for step 2K to be read; a save at step K + 1 (whose own steps
    and weights are clean) must refuse, not write a checkpoint after the NaN."""
    path = tmp_path / "saved.ckpt"
    with pytest.raises(TrainingError, match=f"train.loss is nan at step {NAN_AT} .* found at step {K + 1},"):
        fit(tmp_path, SaveAt(K + 1, path))
    assert not path.exists()


def test_a_save_without_a_fault_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(__name__ + ".NAN_AT", -1)
    path = tmp_path / "saved.ckpt"
    fit(tmp_path, SaveAt(K + 1, path))
    assert torch.load(path, map_location="cpu", weights_only=False)["global_step"] == K + 1
