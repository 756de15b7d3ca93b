"""A resumed DALI run that cannot go on from its saved reader position (another world size, another per-device
batch, data.dali_checkpointing=false) starts its train pipeline fresh for the epoch it resumes, not for epoch 0:
it must not replay epoch 0's order and augmentation draws. One that can goes on in the saved loader's order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from imgcls.data.backends import make_backend
from tests.conftest import compose_config, make_image_folder, tiny_overrides

pytest.importorskip("nvidia.dali")

from imgcls.data.datamodule import ClassificationDataModule  # noqa: E402 - after the skip
from imgcls.data.protocol import LoaderSpec


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("dali_resume"), classes=3, train_per_class=8, val_per_class=2)


def data_cfg(root: Path, *extra: str) -> Any:
    return compose_config(tiny_overrides(root, "data.backend=dali_cpu", *extra)).data


def trainer(epoch: int, rank: int = 0, world: int = 1, steps: int | None = None) -> SimpleNamespace:
    limit = steps if steps is not None else 1.0  # the steps of an epoch the trainer takes
    return SimpleNamespace(current_epoch=epoch, global_rank=rank, world_size=world, limit_train_batches=limit)


def first_batch(loader: Any) -> torch.Tensor:
    batches = iter(loader)
    images = next(batches)[0].clone()
    del batches
    return images


def fresh(cfg: Any, batch: int, rank: int, world: int, first_epoch: int) -> torch.Tensor:
    """The first batch (images: the samples, their order and augmentation draws) of a pipeline built fresh for
    `first_epoch`."""
    loader = make_backend(cfg).loader(LoaderSpec("train", batch, rank, world, 0, first_epoch=first_epoch))
    try:
        return first_batch(loader)
    finally:
        loader.close()


def saved_at_epoch_2(cfg: Any, batch: int = 4) -> dict[str, Any]:
    """The DataModule state of a 1-rank run 2 batches into epoch 2 (what load_state_dict receives)."""
    run = ClassificationDataModule(cfg, batch_size=batch)
    run.trainer = trainer(0, steps=24 // batch)
    loader = run.train_dataloader()
    for epoch in range(2):  # epochs 0 and 1, as Lightning's fit loop takes them: len() batches
        run.trainer.current_epoch = epoch
        batches = iter(loader)
        for _ in range(len(loader)):
            next(batches)
    run.trainer.current_epoch = 2
    batches = iter(loader)
    next(batches), next(batches)
    state = run.state_dict()
    del batches
    run.teardown("fit")
    assert state["epoch"] == 2
    return state


def resumed_first_batch(cfg: Any, state: dict[str, Any], batch: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    resumed = ClassificationDataModule(cfg, batch_size=batch)
    # Lightning asks for the train loader before it restores the epoch counter (estimated_stepping_batches).
    resumed.trainer = trainer(0, rank, world)
    resumed.load_state_dict(state)
    try:
        return first_batch(resumed.train_dataloader())
    finally:
        resumed.teardown("fit")


def test_resume_on_another_world_size_starts_the_saved_epoch_then_goes_on_in_its_order(folder: Path) -> None:
    """A 1-rank run saved in epoch 2 resumed on 2 ranks: each rank's reader starts epoch 2 fresh (before, the
    pipeline was seeded as epoch 0 and replayed its order). A later resume of that run at its own positions, in
    a later epoch, goes on in the order the positions were saved in (the order of epoch 2, not of the later
    epoch: the reader checkpoint points into it)."""
    cfg = data_cfg(folder)
    state = saved_at_epoch_2(cfg)
    for rank in (0, 1):
        got = resumed_first_batch(cfg, state, batch=4, rank=rank, world=2)
        assert torch.equal(got, fresh(cfg, 4, rank, 2, first_epoch=2)), rank
        assert not torch.equal(got, fresh(cfg, 4, rank, 2, first_epoch=0)), rank

    # The 2-rank run goes on: through the rest of epoch 2 and one batch into epoch 3, where it is saved.
    ranks, iterators, positions, expected = [], [], [], []
    for rank in (0, 1):
        run = ClassificationDataModule(cfg, batch_size=4)
        run.trainer = trainer(0, rank, 2, steps=3)
        run.load_state_dict(state)
        loader = run.train_dataloader()
        batches = iter(loader)
        for _ in range(len(loader)):  # epoch 2, as Lightning's fit loop takes it: len() batches
            next(batches)
        run.trainer.current_epoch = 3
        batches = iter(loader)
        next(batches)
        positions.append(run.state_dict()["train_loader"]["positions"][0])  # (no process group: its own only)
        expected.append(next(batches)[0].clone())
        ranks.append(run)
        iterators.append(batches)
    del iterators
    for run in ranks:
        run.teardown("fit")
    later = {"train_loader": {"positions": positions, "epoch": 3}, "epoch": 3}
    for rank in (0, 1):
        assert torch.equal(resumed_first_batch(cfg, later, batch=4, rank=rank, world=2), expected[rank]), rank


def test_resume_without_reader_checkpoints_starts_the_saved_epoch(folder: Path) -> None:
    """data.dali_checkpointing=false keeps no reader position: the resumed reader starts epoch 2 again, as a
    pipeline built for epoch 2 (before: epoch 0's order and draws)."""
    cfg = data_cfg(folder, "data.dali_checkpointing=false")
    state = saved_at_epoch_2(cfg)
    (position,) = state["train_loader"]["positions"]
    assert state["train_loader"]["epoch"] == 2 and position["start"] is None and not position["done"]
    got = resumed_first_batch(cfg, state, batch=4)
    assert torch.equal(got, fresh(cfg, 4, 0, 1, first_epoch=2))
    assert not torch.equal(got, fresh(cfg, 4, 0, 1, first_epoch=0))


def test_position_saved_with_another_batch_is_not_used(folder: Path) -> None:
    """The batch size is in the position's signature: a position saved with batch 4 and resumed with batch 8 is
    not built at (its counts of batches mean other samples); the reader starts epoch 2 fresh."""
    cfg = data_cfg(folder)
    state = saved_at_epoch_2(cfg, batch=4)
    got = resumed_first_batch(cfg, state, batch=8)
    assert torch.equal(got, fresh(cfg, 8, 0, 1, first_epoch=2))
    assert not torch.equal(got, fresh(cfg, 8, 0, 1, first_epoch=0))
