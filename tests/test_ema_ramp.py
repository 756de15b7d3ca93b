"""The EMA's decay ramp as NVIDIA's code counts it: PyTorch's EMA (PYT/image_classification/models/common.py:196-200,
called with the 0-based batch index, training.py:226) and TF2's HvdMovingAverage (TF2/utils/optimizer_factory.py:
149-153, :195-202, called with optimizer.iterations after the step, in float32), bit for bit for the first 20
updates, and a real training run whose EMA weights follow NVIDIA's recurrence from the network as it was built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from imgcls.run.train import run
from imgcls.training.module import ClassificationModule
from tests.conftest import compose_config, make_image_folder, tiny_overrides


def pytorch_decays(mu: float, updates: int) -> list[float]:
    """NVIDIA PyTorch's EMA.__call__(module, step): mu = min(self.mu, (1.0 + step) / (10 + step)), Python floats,
    step = epoch * len(loader) + i: 0 at the first update."""
    return [min(mu, (1.0 + step) / (10 + step)) for step in range(updates)]


def tf2_decays(mu: float, updates: int) -> list[float]:
    """TF2's update_average(optimizer.iterations): step = tf.cast(iterations, tf.float32) is 1 at the first update
    (apply_gradients has counted it); decay = tf.minimum(average_decay, (1. + step) / (10. + step)) in float32."""
    out = []
    for iterations in range(1, updates + 1):
        step = np.float32(iterations) - np.float32(0)  # minus start_step (tfa MovingAverage's default 0)
        out.append(float(np.minimum(np.float32(mu), (np.float32(1.0) + step) / (np.float32(10.0) + step))))
    return out


def _module(*overrides: str) -> ClassificationModule:
    cfg = compose_config([*overrides, "model.arch=test_resnet"])
    model, recipe = (OmegaConf.to_container(node, resolve=True) for node in (cfg.model, cfg.recipe))
    return ClassificationModule(model, recipe, {"lr": 0.1}, ["a", "b"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "nvidia"),
    [
        (["experiment=tf2_efficientnet_b0_8xa100_amp"], tf2_decays),  # every TF2 run: 0.9999, ramped
        (["experiment=resnet50_dgxa100_amp_250e", "recipe.ema_decay=0.9999"], pytorch_decays),  # --use-ema 0.9999
        (["experiment=efficientnet_b0_dgxa100_amp_400e", "recipe.ema_decay=0.99"], pytorch_decays),
    ],
)
def test_the_first_20_decays_are_nvidias_bit_for_bit(overrides: list[str], nvidia: Any) -> None:
    module = _module(*overrides)
    assert module.ema is not None
    # Lightning's global_step once optimizer step k is taken is k: the EMA updates with it (module.py)
    decays = [module.ema.get_decay(step) for step in range(1, 21)]
    expected = nvidia(float(module.ema.decay), 20)
    assert [d.hex() for d in decays] == [e.hex() for e in expected]
    assert expected[0] in (0.1, float(np.float32(2) / np.float32(11)))  # no copy of the weights at the first update


def test_a_fixed_decay_stays_timms() -> None:
    """ema_dynamic_decay=false: timm's EMA (the weights copied at the first update, then the decay)."""
    module = _module("experiment=tf2_efficientnet_b0_8xa100_amp", "recipe.ema_dynamic_decay=false")
    assert module.ema is not None
    assert [module.ema.get_decay(step) for step in (1, 2, 30)] == [0.0, 0.9999, 0.9999]


@pytest.mark.slow
@pytest.mark.parametrize("ramp", ["pytorch", "tf2"])
def test_a_training_run_averages_as_nvidias_ema(ramp: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real fit (4 epochs of 6 optimizer steps): after each step the EMA weights are NVIDIA's
    mu * ema + (1 - mu) * weights, from the weights the network was built with."""
    data = make_image_folder(tmp_path / "data")
    seen: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    start: list[torch.Tensor] = []
    original_start, original_end = ClassificationModule.on_train_start, ClassificationModule.on_train_batch_end

    def floats(net: torch.nn.Module) -> list[torch.Tensor]:
        return [v.detach().clone().double() for v in net.state_dict().values() if v.is_floating_point()]

    def on_train_start(self: ClassificationModule) -> None:
        start.extend(floats(self.net))
        assert self.ema is not None
        assert all(torch.equal(a, b) for a, b in zip(start, floats(self.ema.module), strict=True))
        original_start(self)

    def on_train_batch_end(self: ClassificationModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        original_end(self, outputs, batch, batch_idx)
        assert self.ema is not None
        seen[self.global_step] = (floats(self.net), floats(self.ema.module))

    monkeypatch.setattr(ClassificationModule, "on_train_start", on_train_start)
    monkeypatch.setattr(ClassificationModule, "on_train_batch_end", on_train_batch_end)
    overrides = tiny_overrides(data, "recipe.epochs=4", "recipe.warmup_epochs=0", "recipe.ema_decay=0.9999",
                               "recipe.ema_dynamic_decay=true", f"recipe.ema_ramp={ramp}",
                               "trainer.limit_val_batches=0", "callbacks.checkpoint=null")  # fmt: skip
    run(compose_config(overrides, run_dir=tmp_path / "run"))
    assert sorted(seen) == list(range(1, 25))
    decays = (pytorch_decays if ramp == "pytorch" else tf2_decays)(0.9999, 24)
    average = start
    for step, mu in zip(range(1, 25), decays, strict=True):
        weights, ema = seen[step]
        average = [mu * a + (1.0 - mu) * w for a, w in zip(average, weights, strict=True)]  # common.py:212-213
        for got, want in zip(ema, average, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"step {step}")
    first_weights, first_ema = seen[1]
    assert any(not torch.allclose(e, w) for e, w in zip(first_ema, first_weights, strict=True))  # not a copy
