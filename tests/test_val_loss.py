"""val.loss as NVIDIA's PyTorch code reports it: validation runs the training criterion (PYT/main.py:453-457 at
729963dd), LabelSmoothing (PYT/image_classification/smoothing.py:33-40) in the recipes without mixup. imgcls logs
that as val.loss_smoothed (val_ema.loss_smoothed) next to the plain cross-entropy val.loss, through a real Lightning
Trainer.validate."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, TensorDataset

from imgcls.training.module import ClassificationModule
from tests.conftest import compose_config


def nvidia_label_smoothing(x: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
    """PYT/image_classification/smoothing.py LabelSmoothing.forward, as written there (per sample, before .mean())."""
    logprobs = torch.nn.functional.log_softmax(x, dim=-1)
    nll_loss = -logprobs.gather(dim=-1, index=target.unsqueeze(1)).squeeze(1)
    smooth_loss = -logprobs.mean(dim=-1)
    return (1.0 - smoothing) * nll_loss + smoothing * smooth_loss


def _validate(*overrides: str) -> tuple[ClassificationModule, dict[str, float], torch.Tensor, torch.Tensor]:
    cfg = compose_config(["experiment=resnet50_dgx2v_amp_50e", "data.root=/imagenet", "model.arch=test_resnet",
                          "model.image_size=32", "precision=fp32", *overrides])  # fmt: skip
    model, recipe = (OmegaConf.to_container(node, resolve=True) for node in (cfg.model, cfg.recipe))
    torch.manual_seed(0)
    module = ClassificationModule(model, recipe, {"lr": 0.1, "weight_decay": 0.0}, ["a", "b", "c", "d", "e"])  # type: ignore[arg-type]
    images, labels = torch.randn(12, 3, 32, 32), torch.randint(0, 5, (12,))
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.validate(module, DataLoader(TensorDataset(images, labels), batch_size=4), verbose=False)
    return module, {k: float(v) for k, v in trainer.callback_metrics.items()}, images, labels


def test_val_loss_smoothed_is_nvidias_label_smoothed_validation_loss() -> None:
    module, logged, images, labels = _validate()
    assert module.recipe.label_smoothing == 0.1 and not module.recipe.mixup  # the 50e recipe: NVIDIA's LabelSmoothing
    with torch.no_grad():
        logits = module.net.eval()(images)
    smoothed = nvidia_label_smoothing(logits, labels, 0.1).mean().item()
    plain = torch.nn.functional.cross_entropy(logits, labels).item()
    assert logged["val.loss_smoothed"] == pytest.approx(smoothed, rel=1e-5)
    assert logged["val.loss"] == pytest.approx(plain, rel=1e-5)  # the plain cross-entropy keeps its name
    assert abs(smoothed - plain) > 1e-3


def test_no_smoothing_logs_no_smoothed_loss_and_ema_gets_its_own() -> None:
    _, plain_only, _, _ = _validate("recipe.label_smoothing=0.0")
    assert "val.loss" in plain_only and "val.loss_smoothed" not in plain_only
    _, with_ema, _, _ = _validate("recipe.ema_decay=0.9")
    assert {"val.loss_smoothed", "val_ema.loss_smoothed"} <= set(with_ema)
