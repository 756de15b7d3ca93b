"""compile=true: torch.compile (inductor runs on CPU) trains, keeps checkpoint keys `net.*`, and the training
benchmark compiles the same way as training (ClassificationModule.compile_network)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch

from imgcls.cli import run_train as run
from tests.conftest import compose_config, read_report, tiny_overrides

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


@pytest.mark.slow
def test_compile_trains_and_keeps_checkpoint_keys(image_folder: Path, tmp_path: Path, monkeypatch) -> None:
    modules = compiled_fits(monkeypatch)
    torch._dynamo.reset()
    overrides = tiny_overrides(
        image_folder, "compile=true", "recipe.epochs=1", "recipe.warmup_epochs=0", SMALL_NET,
        "trainer.limit_val_batches=0",  # no validation: its eval-mode graphs would double a cold inductor compile
    )  # fmt: skip
    summary = run(compose_config(overrides, run_dir=tmp_path))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # inductor really compiled
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
