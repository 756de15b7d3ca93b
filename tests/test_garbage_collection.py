"""The collector during training (callbacks/garbage_collection.py): what setup made is frozen from the first step to
the end of training, and unfrozen after it, also when training ends in an exception."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

import imgcls.run.train
from imgcls.callbacks.garbage_collection import FreezeSetupObjects
from tests.conftest import compose_config, tiny_overrides


class FrozenAtEachStep(L.Callback):
    def __init__(self) -> None:
        self.frozen: list[int] = []

    def on_train_batch_start(self, *args: Any) -> None:
        self.frozen.append(gc.get_freeze_count())


@pytest.mark.slow
def test_a_training_run_steps_with_its_setup_frozen_and_unfreezes_at_the_end(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = FrozenAtEachStep()
    real_build = imgcls.run.train.build_trainer
    monkeypatch.setattr(imgcls.run.train, "build_trainer", lambda cfg, plan, callbacks, loggers: real_build(
        cfg, plan, [*callbacks, probe], loggers))  # fmt: skip
    assert gc.get_freeze_count() == 0
    imgcls.run.train.run(compose_config(tiny_overrides(image_folder), run_dir=tmp_path))
    # torch, Lightning, Hydra and the run's own objects: far more than a few thousand
    assert len(probe.frozen) >= 4 and min(probe.frozen) > 50_000, probe.frozen[:3]
    assert gc.get_freeze_count() == 0


def test_an_exception_in_training_unfreezes(tmp_path: Path) -> None:
    class Fails(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch_idx == 2:
                assert gc.get_freeze_count() > 0
                raise RuntimeError("step 2")
            return self.layer(batch[0]).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 4)), batch_size=2)
    trainer = L.Trainer(
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[FreezeSetupObjects()], default_root_dir=tmp_path,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="step 2"):
        trainer.fit(Fails(), data)
    assert gc.get_freeze_count() == 0
