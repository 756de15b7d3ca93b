"""compile=true: torch.compile (inductor runs on CPU) trains, keeps checkpoint keys `net.*`, and the training
benchmark compiles the same way as training (ClassificationModule.compile_network)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch

from imgcls.cli import run_train as run
from tests.conftest import compose_config, free_port, read_report, tiny_overrides

# timm's test_resnet (a ResNet of 370k parameters): inductor's compile time grows with the graph, and on these
# CPUs debug=tiny's ResNet18 took ~3 minutes to compile forward, backward and eval in CI.
SMALL_NET = "model.arch=test_resnet"


def compiled_fits(monkeypatch: pytest.MonkeyPatch) -> list[L.LightningModule]:
    """The modules Trainer.fit was given, and torch._dynamo's count of compiled frames."""
    modules: list[L.LightningModule] = []
    fit = L.Trainer.fit

    def recording_fit(self: L.Trainer, model: L.LightningModule, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        modules.append(model)
        return fit(self, model, *args, **kwargs)

    monkeypatch.setattr(L.Trainer, "fit", recording_fit)
    return modules


def assert_compiled_in_place(module: L.LightningModule) -> None:
    from timm.models.resnet import ResNet

    assert type(module.net) is ResNet and module.net._compiled_call_impl is not None
    assert all(k.startswith(("net.conv1", "net.bn1", "net.layer", "net.fc")) for k in module.state_dict() if
               k.startswith("net."))  # fmt: skip


def ddp_bucket_splits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(buckets, DDP's bucket cap) each time dynamo's DDPOptimizer split a compiled graph at DDP's buckets."""
    from torch._dynamo.backends import distributed

    splits: list[tuple[int, int]] = []
    real = distributed.pretty_print_buckets

    def recording(buckets: list, bucket_bytes_cap: int) -> None:
        splits.append((len(buckets), bucket_bytes_cap))
        real(buckets, bucket_bytes_cap)

    monkeypatch.setattr(distributed, "pretty_print_buckets", recording)
    return splits


def one_process_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's DDP in this process (world size 1, gloo): the variables it sets are this test's alone."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)  # restored to unset at the end, whatever Lightning sets meanwhile


@pytest.mark.slow
def test_compile_trains_under_ddp_and_keeps_checkpoint_keys(image_folder: Path, tmp_path: Path, monkeypatch) -> None:
    """compile=true with DDP: the network is compiled in place and DDP wraps it (as torch documents for DDP), so
    dynamo compiles it inside DDP's forward, where its DDPOptimizer splits the graph at DDP's gradient buckets
    and each bucket's all-reduce overlaps the rest of the backward. A network first compiled outside DDP's
    forward, or the whole module compiled around DDP, would train with one fused backward and no overlap."""
    modules = compiled_fits(monkeypatch)
    splits = ddp_bucket_splits(monkeypatch)
    one_process_ddp(monkeypatch)
    torch._dynamo.reset()
    overrides = tiny_overrides(
        image_folder, "compile=true", "recipe.epochs=1", "recipe.warmup_epochs=0", SMALL_NET, "trainer.strategy=ddp",
        "trainer.limit_val_batches=0",  # no validation: its eval-mode graphs would double a cold inductor compile
    )  # fmt: skip
    try:
        summary = run(compose_config(overrides, run_dir=tmp_path))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # inductor really compiled
    # test_resnet's 1.4 MB of parameters: DDP's first bucket (1 MiB) and the rest, so at least 2 pieces
    assert splits and splits[0][0] >= 2 and splits[0][1] == 25 * 1024 * 1024, splits
    assert_compiled_in_place(modules[0])
    assert read_report(tmp_path)["epochs"][0]["step"] == 6 and torch.isfinite(torch.tensor(summary["train.loss"]))
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert any(k.startswith("net.conv1.") for k in state) and not [k for k in state if "_orig_mod" in k]


@pytest.mark.slow
def test_training_benchmark_compiles_like_training(image_folder: Path, tmp_path: Path, monkeypatch) -> None:
    modules = compiled_fits(monkeypatch)
    overrides = tiny_overrides(image_folder, "compile=true", "mode=benchmark", "benchmark.warmup=1", SMALL_NET,
                               "benchmark.iterations=2")  # fmt: skip
    run(compose_config(overrides, run_dir=tmp_path))
    assert_compiled_in_place(modules[0])  # was torch.compile(module.net): keys net._orig_mod.*
    assert json.loads((tmp_path / "benchmark.json").read_text())["iterations"] == 2
