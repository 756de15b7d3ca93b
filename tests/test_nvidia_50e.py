"""The PyTorch 50-epoch runs as NVIDIA's scripts ran them (DGX2_RN50_{AMP,FP32}_50E.sh, `git show 7e96091c^`): apex
amp O1 with a static loss scale of 128 (PYT/main.py:496-502 there), nchw, DALI on the GPU with a train crop that does
not antialias (the DALI of the 20.06 container), 16 processes, warmup 16, 50 epochs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from imgcls.training.precision import StaticGradScaler, resolve_precision
from tests.conftest import compose_config

RUNS = ["resnet50_dgx2v_amp_50e", "resnet50_dgx2v_fp32_50e"]


@pytest.mark.parametrize("name", RUNS)
def test_the_50e_runs_compose_to_nvidias_scripts(name: str) -> None:
    cfg = compose_config([f"experiment={name}", "data.root=/imagenet"])
    assert (cfg.recipe.epochs, cfg.recipe.warmup_epochs, cfg.trainer.devices) == (50, 16, 16)  # --epochs, --warmup
    assert cfg.data.backend == "dali_gpu"  # --data-backend dali-gpu
    assert cfg.data.dali_train_antialias is False  # RandomResizedCrop(INTERP_LINEAR): DALI's Linear filter
    assert cfg.model.channels_last is False  # no --memory-format: nchw


def test_the_50e_amp_run_keeps_a_static_scale_of_128_through_fp16_steps() -> None:
    """Real fp16 autocast and GradScaler steps on the CPU (precision.cpu_fp16=true), the growth interval cut to 2 so
    that a dynamic scaler would have doubled twice within the 6 finite steps."""
    cfg = compose_config(["experiment=resnet50_dgx2v_amp_50e", "data.root=/imagenet", "precision.cpu_fp16=true",
                          "precision.loss_scale.growth_interval=2"])  # fmt: skip
    assert cfg.precision.loss_scale.dynamic is False and cfg.precision.loss_scale.init_scale == 128.0
    precision, plugins = resolve_precision(cfg.precision, "cpu")
    (plugin,) = plugins
    scaler = plugin.scaler
    assert precision is None and plugin.precision == "16-mixed" and isinstance(scaler, StaticGradScaler)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    images, labels = torch.randn(32, 8), torch.randint(0, 3, (32,))
    scales, before = [], [p.detach().clone() for p in net.parameters()]
    for _ in range(6):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(net(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales == [128.0] * 6
    assert all(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))  # the steps were taken
