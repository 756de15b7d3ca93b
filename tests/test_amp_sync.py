"""fp16 loss scaling without a host sync per step (GradScaler.step reads found_inf with .item() at every
optimizer step unless the optimizer is fused). With fused SGD the scaler hands the flag to the kernel; on CPU
the same path runs with precision.cpu_fp16=true, and every blocking call is counted as in test_host_sync."""

from __future__ import annotations

from pathlib import Path

import pytest

import imgcls.run.train
from tests.conftest import compose_config, tiny_overrides
from tests.test_amp import FP16_NET
from tests.test_host_sync import SyncCounter, count_syncs


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "rmsprop_tf", "rmsprop"])  # rmsprop_tf: every TF2 EfficientNet run
def test_fp16_loss_scaling_syncs_at_most_once_per_k_steps(
    optimizer: str, image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = SyncCounter()
    count_syncs(monkeypatch, counter)
    overrides = tiny_overrides(image_folder, "recipe.epochs=2", "precision=amp", "precision.cpu_fp16=true",
                               "model.channels_last=false", FP16_NET, f"recipe.optimizer={optimizer}",
                               "recipe.rmsprop_alpha=0.9", "recipe.rmsprop_eps=0.001")  # fmt: skip
    imgcls.run.train.run(compose_config(overrides, run_dir=tmp_path))
    assert counter.started == 12
    syncing = {batch: calls for batch, calls in counter.calls.items() if calls}
    # FiniteLoss reads its device flags once every 10 optimizer steps: the batch ending step 10, nothing else.
    assert set(syncing) <= {9}, "\n".join(f"batch {b}: {c}" for b, c in syncing.items())


@pytest.mark.slow
def test_fp16_with_gradient_clipping_uses_the_unfused_optimizer(image_folder: Path, tmp_path: Path) -> None:
    """Lightning clips after unscaling, which a fused optimizer does inside its step: it raises for that pair."""
    overrides = tiny_overrides(image_folder, "recipe.epochs=1", "precision=amp", "precision.cpu_fp16=true",
                               "model.channels_last=false", "trainer.gradient_clip_val=1.0", FP16_NET)  # fmt: skip
    summary = imgcls.run.train.run(compose_config(overrides, run_dir=tmp_path))
    assert summary["train.loss"] > 0
