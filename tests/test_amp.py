"""fp16 AMP with NVIDIA's dynamic loss scaling, run for real on the CPU (precision.cpu_fp16=true): the scaler's
settings, a skipped step on overflow (counted, weights untouched, training goes on), and a stop only when
overflows persist, with the unscaled loss."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from imgcls.cli import guarded
from imgcls.run.train import run
from imgcls.training.module import ClassificationModule
from imgcls.training.precision import resolve_precision
from tests.conftest import compose_config, make_image_folder, read_report, tiny_overrides


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"), classes=3, train_per_class=8, val_per_class=2)


# fp16 convolutions on a CPU run ~12x slower than fp32: these tests check the loss scaler, not the network, so they
# train timm's tiny test_resnet (370k parameters) instead of debug=tiny's ResNet18.
FP16_NET = "model.arch=test_resnet"


def amp_overrides(data: Path, *extra: str) -> list[str]:
    return tiny_overrides(
        data,
        "precision=amp",
        "precision.cpu_fp16=true",
        "precision.channels_last=false",
        FP16_NET,
        "recipe.warmup_epochs=0",
        "trainer.limit_val_batches=0",
        "callbacks.checkpoint=null",
        *extra,
    )


class _InfGrad(torch.autograd.Function):
    """Identity forward (the loss stays finite), infinite gradient backward: an fp16 gradient overflow."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * math.inf


def inject(monkeypatch: pytest.MonkeyPatch, fault: str, steps: set[int] | None, seen: dict[str, Any]) -> None:
    """Wrap the real training_step: at the optimizer steps in `steps` (None: every step from 3 on) the loss is
    NaN ("nan") or its gradients overflow ("overflow"). Records scales, weights, optimizer state (but its step
    counters) and losses per step."""
    original = ClassificationModule.training_step

    def training_step(self: ClassificationModule, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        out = original(self, batch, batch_idx)
        step = self.global_step
        seen.setdefault("scale", {})[step] = self.trainer.precision_plugin.scaler.get_scale()
        seen.setdefault("weights", {})[step] = [p.detach().clone() for p in self.parameters()]
        state = self.trainer.optimizers[0].state
        seen.setdefault("state", {})[step] = [
            v.clone() for p in self.parameters() for k, v in sorted(state.get(p, {}).items()) if k != "step"
        ]
        if steps is None and step >= 3 or steps is not None and step in steps:
            loss = out["loss"] * math.nan if fault == "nan" else _InfGrad.apply(out["loss"])
            out = {"loss": loss, "loss_value": loss.detach()}
        seen.setdefault("loss", {})[step] = float(out["loss_value"])
        return out

    monkeypatch.setattr(ClassificationModule, "training_step", training_step)


def test_cpu_amp_is_bf16_unless_fp16_is_asked_for(caplog: pytest.LogCaptureFixture) -> None:
    cfg = compose_config(["precision=amp"])
    with caplog.at_level(logging.WARNING, logger="imgcls.training.precision"):
        assert resolve_precision(cfg.precision, "cpu") == ("bf16-mixed", [])
    assert "precision.cpu_fp16=true" in caplog.text
    fp16 = compose_config(["precision=amp", "precision.cpu_fp16=true"]).precision
    precision, plugins = resolve_precision(fp16, "cpu")
    (plugin,) = plugins
    scaler = plugin.scaler
    assert precision is None and plugin.precision == "16-mixed" and plugin.device == "cpu"
    assert scaler._device == "cpu" and scaler.is_enabled()
    assert (scaler._init_scale, scaler._growth_interval, scaler._growth_factor, scaler._backoff_factor) == (
        128.0,
        100,
        2.0,
        0.5,
    )


def test_tf2_amp_experiments_scale_the_loss_as_keras_mixed_float16() -> None:
    """TF2 --use_amp is Keras's mixed_float16 policy with loss_scale='dynamic' (TF2/utils/setup.py:77,
    runtime/runner.py:186): initial scale 2**15, x2 after 2000 finite steps, halved on an overflow. The PyTorch
    recipes' GradScaler starts at 128 and grows every 100 steps; the TF2 experiments used to inherit that."""
    names = sorted(p.stem for p in (Path(__file__).parents[1] / "conf" / "experiment").glob("tf2_*_amp.yaml"))
    assert len(names) == 10
    for name in names:
        cfg = compose_config([f"experiment={name}", "precision.cpu_fp16=true"]).precision
        (plugin,) = resolve_precision(cfg, "cpu")[1]
        scaler = plugin.scaler
        assert (scaler._init_scale, scaler._growth_interval, scaler._growth_factor, scaler._backoff_factor) == (
            2.0**15, 2000, 2.0, 0.5,
        ), name  # fmt: skip
    pytorch = compose_config(["experiment=efficientnet_b0_dgxa100_amp_400e"]).precision.loss_scale
    assert (pytorch.init_scale, pytorch.growth_interval) == (128.0, 100)


@pytest.mark.slow
def test_fp16_run_on_cpu_scales_from_128_and_grows(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    inject(monkeypatch, "none", set(), seen)
    # 3 steps an epoch; growth after 4 good steps here (100 in the recipe: same code path, fewer steps)
    summary = run(
        compose_config(
            amp_overrides(data, "recipe.epochs=2", "precision.loss_scale.growth_interval=4"), run_dir=tmp_path
        )
    )
    assert seen["scale"] == {0: 128.0, 1: 128.0, 2: 128.0, 3: 128.0, 4: 256.0, 5: 256.0}
    assert summary["train.amp_skipped_steps"] == 0
    assert all(math.isfinite(v) for v in seen["loss"].values())


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "rmsprop_tf"])
@pytest.mark.parametrize("step", [2, 0])
def test_one_overflow_is_skipped_counted_and_training_goes_on(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int, optimizer: str
) -> None:
    """Also at the very first step, where torch's fused SGD makes its momentum buffers (empty_like) and, skipping
    the update, left them unwritten: the next step read uninitialized memory (weights of 1e36, then NaN).
    rmsprop_tf (every TF2 EfficientNet run) skips on the device (imgcls's RMSpropTF gates its update by the flag):
    weights and state stay as they were; at the very first step the state is the initial one."""
    seen: dict[str, Any] = {}
    inject(monkeypatch, "overflow", {step}, seen)
    rmsprop = ["recipe.rmsprop_alpha=0.9", "recipe.rmsprop_eps=0.001"] if optimizer == "rmsprop_tf" else []
    overrides = amp_overrides(data, "recipe.epochs=3", f"recipe.optimizer={optimizer}", *rmsprop)
    summary = run(compose_config(overrides, run_dir=tmp_path))
    assert seen["scale"][step] == 128.0 and seen["scale"][step + 1] == 64.0 and seen["scale"][8] == 64.0  # halved once
    before, after = seen["weights"][step], seen["weights"][step + 1]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # the skipped step changed nothing
    if seen["state"][step]:
        assert all(torch.equal(a, b) for a, b in zip(seen["state"][step], seen["state"][step + 1], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(after, seen["weights"][step + 2], strict=True))
    assert all(math.isfinite(v) for v in seen["loss"].values())
    assert max(w.abs().max().item() for w in seen["weights"][8]) < 100
    report = read_report(tmp_path)
    assert [row["train.amp_skipped_steps"] for row in report["epochs"]] == [1, 1, 1]  # running total
    assert summary["train.amp_skipped_steps"] == 1 and report["epochs"][-1]["step"] == 9


@pytest.mark.slow
def test_static_loss_scale_stays_put_and_still_skips_an_overflow(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TF1's --static_loss_scale 128 (precision.loss_scale.dynamic=false): the scale never halves or grows, the
    overflowing step is skipped and counted all the same."""
    seen: dict[str, Any] = {}
    inject(monkeypatch, "overflow", {2}, seen)
    overrides = amp_overrides(data, "recipe.epochs=3", "precision.loss_scale.dynamic=false",
                              "precision.loss_scale.growth_interval=2")  # fmt: skip
    summary = run(compose_config(overrides, run_dir=tmp_path))
    assert set(seen["scale"].values()) == {128.0}
    assert all(torch.equal(a, b) for a, b in zip(seen["weights"][2], seen["weights"][3], strict=True))
    assert summary["train.amp_skipped_steps"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["nan", "overflow"])
def test_persistent_overflow_stops_with_exit_3_and_the_unscaled_loss(
    fault: str, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    seen: dict[str, Any] = {}
    inject(monkeypatch, fault, None, seen)
    cfg = compose_config(
        amp_overrides(data, "recipe.epochs=5", "precision.max_consecutive_overflows=5"), run_dir=tmp_path
    )
    with pytest.raises(SystemExit) as exit_info:
        guarded(run, cfg)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("imgcls: error:")]
    assert exit_info.value.code == 3 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    line = lines[0]
    assert "overflowed in" in line and "max_consecutive_overflows=5" in line
    # Steps 3.. skipped; the check at the end of epoch 3 (step 9) sees 6 in a row (>= 5) and stops there.
    assert "by step 9" in line and max(seen["loss"]) == 8
    value = float(line.split("train.loss (unscaled) ")[1].split(",")[0])
    last = seen["loss"][8]
    if fault == "nan":
        assert math.isnan(value)
    else:
        assert value == pytest.approx(last, rel=1e-6) and 0 < value < 10  # the loss itself, not x scale
    assert seen["scale"][8] == 128.0 / 2**5  # five halvings (steps 3..7) before step 8 ran
