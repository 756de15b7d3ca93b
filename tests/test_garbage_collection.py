"""The collector during training (callbacks/garbage_collection.py): what setup made is frozen from the first step to
the end of training, and unfrozen after it, also when training ends in an exception."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import lightning as L
import pytest

import imgcls.run.train
from imgcls.callbacks.garbage_collection import FreezeSetupObjects
from tests.conftest import compose_config, tiny_overrides
from tests.tiny_fit import tiny_fit, tiny_trainer


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
    probe = FrozenAtEachStep()
    with pytest.raises(RuntimeError, match="step 2"):
        tiny_fit(tiny_trainer(tmp_path, [FreezeSetupObjects(), probe]), raise_at=2)
    assert len(probe.frozen) == 3 and min(probe.frozen) > 0  # frozen at each step up to the one that raised
    assert gc.get_freeze_count() == 0
