"""trainer.sync_batchnorm=true keeps EfficientNet's fused BN+SiLU.

The network is converted by the layer-sync plugin the run's Trainer carries (the one Lightning's DDP
strategy applies before wrapping), on the real ClassificationModule with EMA, and compared with the
unconverted network on real photos in eval mode. SyncBatchNorm's eval forward uses the running
statistics only, so it runs on CPU; its training forward is CUDA-only (hence the CPU refusal below).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from imgcls.errors import ConfigError
from imgcls.run.plan import resolve_plan
from imgcls.run.trainer import build_trainer
from imgcls.training.module import ClassificationModule
from imgcls.training.sync_batchnorm import TimmSyncBatchNorm, count_sync_batchnorm
from tests.conftest import compose_config, sample_photos, tiny_overrides


def photo_batch(folder: Path, count: int = 6, size: int = 64) -> torch.Tensor:
    """`count` real photos, resized and normalized like the val loader."""
    images = []
    for path in sample_photos(folder, count):
        with Image.open(path) as image:
            images.append(np.asarray(image.convert("RGB").resize((size, size), Image.BILINEAR), np.float32) / 255)
    batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    return (batch - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)


def sync_bn_run(image_folder: Path, tmp_path: Path):  # noqa: ANN201 - (module, layer-sync plugin)
    """The module and Trainer a `trainer.sync_batchnorm=true` EfficientNet-B0 run with EMA builds."""
    cfg = compose_config(
        tiny_overrides(image_folder, "model=efficientnet_b0", "recipe.ema_decay=0.9999", "trainer.sync_batchnorm=true"),
        run_dir=tmp_path,
    )
    torch.manual_seed(0)
    plan = resolve_plan(cfg)
    module = ClassificationModule(
        model=dict(cfg.model), recipe=dict(cfg.recipe), plan=plan.as_dict(), classes=[f"c{k}" for k in range(10)]
    )
    trainer = build_trainer(cfg, plan, callbacks=[], loggers=[])
    return module, trainer._accelerator_connector._layer_sync  # what DDPStrategy.setup applies


@pytest.mark.slow
def test_sync_bn_conversion_keeps_efficientnet_activations(image_folder: Path, tmp_path: Path) -> None:
    module, layer_sync = sync_bn_run(image_folder, tmp_path)
    # Random BN statistics, so that a lost activation changes the output (fresh BN is near identity).
    generator = torch.Generator().manual_seed(0)
    for bn in module.modules():
        if isinstance(bn, torch.nn.BatchNorm2d):
            bn.running_mean.copy_(torch.randn(bn.num_features, generator=generator) * 0.1)
            bn.running_var.copy_(torch.rand(bn.num_features, generator=generator) + 0.5)
    module.ema.module.load_state_dict(module.net.state_dict())
    images = photo_batch(tmp_path / "photos")
    reference = copy.deepcopy(module).eval()

    converted = layer_sync.apply(module).eval()
    # B0: 49 BatchNormAct2d (stem, blocks, head) with SiLU; net and its EMA copy alike.
    assert count_sync_batchnorm(converted.net) == (49, 49)
    assert count_sync_batchnorm(converted.ema.module) == (49, 49)
    with torch.no_grad():
        expected = reference.net(images)
        assert torch.allclose(converted.net(images), expected, atol=1e-5)
        assert torch.allclose(converted.ema.module(images), reference.ema.module(images), atol=1e-5)

    reverted = layer_sync.revert(converted).eval()  # Lightning's teardown after fit
    assert count_sync_batchnorm(reverted) == (0, 0)
    with torch.no_grad():
        assert torch.allclose(reverted.net(images), expected, atol=1e-5)
    assert isinstance(layer_sync, TimmSyncBatchNorm)


@pytest.mark.slow
def test_torch_converter_drops_the_activations(image_folder: Path, tmp_path: Path) -> None:
    """Why the plugin exists: Lightning's default converter on the same module changes its outputs."""
    from lightning.pytorch.plugins.layer_sync import TorchSyncBatchNorm

    module, _ = sync_bn_run(image_folder, tmp_path)
    images = photo_batch(tmp_path / "photos", 2)
    with torch.no_grad():
        expected = module.eval().net(images)
        converted = TorchSyncBatchNorm().apply(module).eval()
        assert not torch.allclose(converted.net(images), expected, atol=1e-3)
    assert count_sync_batchnorm(converted.net) == (49, 0)


@pytest.mark.slow
def test_sync_batchnorm_refused_for_multi_process_cpu_runs(image_folder: Path, tmp_path: Path) -> None:
    overrides = tiny_overrides(image_folder, "trainer.sync_batchnorm=true", "trainer.devices=2", "data.batch_size=4")
    cfg = compose_config(overrides)
    with pytest.raises(ConfigError, match="sync_batchnorm"):
        build_trainer(cfg, resolve_plan(cfg, check_devices=False), callbacks=[], loggers=[])
