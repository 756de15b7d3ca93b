"""The data-backend protocol (data/protocol.py): the DataModule holds nothing of any backend, the same DataModule
code resumes every backend from its loader's own state, and a loader whose ranks differ (DALI) gathers them
itself, so that the state Lightning saves from rank 0 resumes every rank."""

from __future__ import annotations

import ast
import importlib.util
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from imgcls.data.datamodule import ClassificationDataModule
from tests.conftest import compose_config, make_image_folder, tiny_overrides

DATAMODULE = Path(__file__).resolve().parents[1] / "src" / "imgcls" / "data" / "datamodule.py"


def test_the_datamodule_names_no_backend() -> None:
    """No import of a backend's package and no name or string of one (DALI's positions, a sampler, a worker)."""
    tree = ast.parse(DATAMODULE.read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m and m.startswith(("imgcls.data.dali", "imgcls.data.torchvision"))}
    assert "imgcls.data.synthetic" not in imported
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node) is not None
    }
    words = [node.id for node in ast.walk(tree) if isinstance(node, ast.Name)]
    words += [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
    words += [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]
    backend_words = ("dali", "position", "sampler", "pipeline", "synthetic", "torchvision", "normalize")
    assert [w for w in words if any(b in w.lower() for b in backend_words)] == []


def _trainer(epoch: int = 0) -> SimpleNamespace:
    return SimpleNamespace(current_epoch=epoch, global_rank=0, world_size=1, limit_train_batches=1.0)


def _data_cfg(root: Path, backend: str) -> Any:
    if backend == "synthetic":
        return compose_config(
            ["data=synthetic", "data.num_classes=3", "data.train_samples=24", "model.image_size=8"]
        ).data
    return compose_config(tiny_overrides(root, f"data.backend={backend}", "data.num_workers=0")).data


@pytest.mark.parametrize("backend", ["torchvision", "dali_cpu", "synthetic"])
def test_one_datamodule_path_resumes_every_backend(tmp_path: Path, backend: str) -> None:
    """Two batches into epoch 1, saved; a new DataModule (a new process) loads that state and its train loader
    goes on with the third batch of the uninterrupted epoch, through the same DataModule calls for every backend.
    DALI also from the layout of an earlier imgcls's checkpoint ({"dali": positions, "epoch": ...})."""
    if backend.startswith("dali"):
        pytest.importorskip("nvidia.dali")
    root = make_image_folder(tmp_path, classes=3, train_per_class=8, val_per_class=2)
    cfg = _data_cfg(root, backend)
    first = ClassificationDataModule(cfg, batch_size=4)
    first.trainer = _trainer()
    loader = first.train_dataloader()
    for _ in iter(loader):  # epoch 0, whole
        pass
    first.trainer.current_epoch = 1
    if hasattr(loader, "sampler"):
        loader.sampler.set_epoch(1)  # as Lightning does at an epoch's start
    batches = iter(loader)
    next(batches), next(batches)
    state = first.state_dict()
    expected = [(x.clone(), y.clone()) for x, y in batches]  # the rest of epoch 1
    first.teardown("fit")
    assert set(state) == {"train_loader", "epoch"} and state["epoch"] == 1

    layouts = [state]
    if backend.startswith("dali"):
        layouts.append({"dali": state["train_loader"]["positions"], "epoch": 1})
    for saved in layouts:
        resumed = ClassificationDataModule(cfg, batch_size=4)
        resumed.trainer = _trainer(0)  # Lightning asks before it restores the epoch counter
        resumed.load_state_dict(saved)
        loader = resumed.train_dataloader()
        resumed.trainer.current_epoch = 1
        assert resumed.train_dataloader() is loader
        if hasattr(loader, "sampler"):
            loader.sampler.set_epoch(1)
        rest = [(x.clone(), y.clone()) for x, y in loader]
        resumed.teardown("fit")
        assert len(rest) == len(expected) == len(loader) - 2
        for (x, y), (ex, ey) in zip(rest, expected):
            assert torch.equal(x, ex) and torch.equal(y, ey)


RANK_SCRIPT = """
import pickle, sys
import torch.distributed as dist
sys.path.insert(0, {repo!r})
from imgcls.data.backends import make_backend
from imgcls.data.protocol import LoaderSpec
from tests.conftest import compose_config, tiny_overrides

dist.init_process_group("gloo")
rank = dist.get_rank()
cfg = compose_config(tiny_overrides({root!r}, "data.backend=dali_cpu", "data.num_workers=1")).data
backend = make_backend(cfg)
loader = backend.loader(LoaderSpec("train", 4, rank, 2))
batches = iter(loader)
next(batches), next(batches)
state = loader.state_dict()  # a collective: every rank's position
expected = next(batches)[1].tolist()
del batches
loader.close()
box = [state]
dist.broadcast_object_list(box, src=0)  # Lightning saves rank 0's state and loads it into every rank
resumed = backend.loader(LoaderSpec("train", 4, rank, 2, resume=box[0]))
got = next(iter(resumed))[1].tolist()
resumed.close()
with open(sys.argv[1], "wb") as out:  # a DALI checkpoint is bytes
    pickle.dump({{"state": state, "expected": expected, "got": got}}, out)
"""


@pytest.mark.slow
def test_a_dali_loader_state_holds_every_rank_position(tmp_path: Path) -> None:
    """2 gloo ranks, each 2 batches into its epoch: each rank's state_dict() holds both ranks' positions, the same
    on both, and rank 0's state resumes each rank at its own next batch (the ranks read different samples)."""
    if importlib.util.find_spec("nvidia.dali") is None:
        pytest.skip("nvidia.dali is not installed")
    from tests.conftest import ROOT, run_two_gloo_ranks

    root = make_image_folder(tmp_path / "data", classes=3, train_per_class=8, val_per_class=2)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(repo=str(ROOT), root=str(root)))
    run_two_gloo_ranks(script, [tmp_path / f"rank{r}.pickle" for r in (0, 1)], timeout=180)
    rows = [pickle.loads((tmp_path / f"rank{r}.pickle").read_bytes()) for r in (0, 1)]
    assert rows[0]["state"] == rows[1]["state"]
    positions = rows[0]["state"]["positions"]
    assert len(positions) == 2 and positions[0]["start"] != positions[1]["start"]
    assert [p["steps"] for p in positions] == [2, 2]
    for row in rows:
        assert row["got"] == row["expected"]
