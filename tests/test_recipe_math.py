"""The recipe arithmetic: accumulation, LR scaling and schedule, parameter groups, mixup targets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from timm.data import Mixup

from imgcls.config.checks import check_config
from imgcls.config.schema import ModelSchema, RecipeSchema
from imgcls.errors import ConfigError
from imgcls.models import build_network
from imgcls.run.plan import accumulation_steps, fit_per_device, make_plan
from imgcls.run.train import run
from imgcls.training.optimizer import build_optimizer, parameter_groups
from imgcls.training.scheduler import EpochStartLR, build_scheduler, scaled_lr, warmup_steps
from imgcls.typed_config import settings
from tests.conftest import compose_config, read_report, tiny_overrides


def _sgd(momentum: float) -> RecipeSchema:
    return settings(RecipeSchema, {"optimizer": "sgd", "momentum": momentum})


@pytest.mark.parametrize(
    "global_batch,per_device,world,expected",
    [(2048, 256, 8, 1), (4096, 256, 8, 2), (4096, 32, 8, 16), (1024, 64, 8, 2), (256, 32, 1, 8), (64, 32, 2, 1)],
)
def test_accumulation(global_batch: int, per_device: int, world: int, expected: int) -> None:
    assert accumulation_steps(global_batch, per_device, world) == expected


@pytest.mark.parametrize("global_batch,per_device,world", [(1000, 256, 1), (2048, 96, 8), (100, 64, 2)])
def test_accumulation_that_does_not_divide_is_an_error(global_batch: int, per_device: int, world: int) -> None:
    with pytest.raises(ConfigError, match=f"recipe.global_batch_size={global_batch} is not a multiple"):
        accumulation_steps(global_batch, per_device, world)


def test_accumulation_advice_is_one_that_can_be_followed() -> None:
    with pytest.raises(ConfigError, match="choose a per-device batch that divides 256$"):
        accumulation_steps(2048, 96, 8)  # 2048 / 8 = 256 a device: 128, 64, ... divide it
    with pytest.raises(ConfigError, match="no per-device batch divides it over 3 devices: use a number of devices"):
        accumulation_steps(2048, 256, 3)  # 2048 / 3 is no whole number: no batch size can help


def test_fit_per_device_keeps_the_global_batch() -> None:
    assert fit_per_device(112, 4096, 8) == 64  # RN50 FP32 DGX-1 row under the 4096 EfficientNet batch
    assert fit_per_device(256, 2048, 8) == 256
    assert fit_per_device(96, 1536, 16) == 96


def test_lr_follows_the_global_batch() -> None:
    assert scaled_lr(0.256, 2048) == pytest.approx(2.048)
    assert scaled_lr(0.256, 896) == pytest.approx(0.896)
    plan = make_plan(per_device_batch=128, global_batch=1024, world_size=8, lr_per_256=0.256, weight_decay=1 / 16384)
    assert (plan.lr, plan.accumulation) == (pytest.approx(1.024), 1)


def _lr_curve(
    total: int,
    warmup: int,
    base: float = 2.048,
    end: float = 0.0,
    schedule: str = "cosine",
    epochs: int | None = None,
    per_epoch: bool = False,
    milestones: tuple[float, ...] = (),
) -> list[float]:
    net = torch.nn.Linear(2, 2)
    opt = build_optimizer([{"params": net.parameters()}], _sgd(0.875), base)
    sched = build_scheduler(opt, total, warmup, end, schedule, milestones, epochs=epochs)
    if per_epoch:  # recipe.lr_interval=epoch
        sched = EpochStartLR(sched, total // epochs, warmup * epochs // total)
    lrs = [opt.param_groups[0]["lr"]]
    for step in range(1, total + 1):  # how ClassificationModule.lr_scheduler_step drives it
        sched.step_update(num_updates=step)
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def test_lr_at_step_zero_end_of_warmup_and_end() -> None:
    # 90 epochs x 10 steps, 8 warmup epochs -> 80 warmup steps.
    total, warmup = 900, warmup_steps(900, 90, 8)
    assert warmup == 80
    lrs = _lr_curve(total, warmup)
    assert lrs[0] == 0.0  # linear warmup from zero
    assert lrs[40] == pytest.approx(2.048 * 40 / 80)  # linear in steps, not per epoch
    assert lrs[80] == pytest.approx(2.048)  # peak at the end of warmup
    mid = 80 + (900 - 80) // 2
    assert lrs[mid] == pytest.approx(2.048 * 0.5 * (1 + math.cos(math.pi * (mid - 80) / 820)), rel=1e-6)
    assert lrs[900] == pytest.approx(0.0, abs=1e-9)  # cosine reaches end_lr at the last step
    assert all(b <= a + 1e-12 for a, b in zip(lrs[80:], lrs[81:]))  # monotone decay after warmup


def test_lr_schedule_changes_every_step_not_every_epoch() -> None:
    lrs = _lr_curve(100, 10)
    assert len(set(round(x, 12) for x in lrs[10:20])) == 10


def _per_epoch(lrs: list[float], steps: int, epochs: int) -> list[float]:
    """The LR of each epoch's steps, checking that it is one value per epoch (lrs[t] is step t's LR)."""
    values = []
    for epoch in range(epochs):
        within = lrs[epoch * steps : (epoch + 1) * steps]
        assert max(within) - min(within) < 1e-12, (epoch, within)
        values.append(within[0])
    return values


def test_epoch_interval_is_nvidias_per_epoch_lr_policy() -> None:
    """recipe.lr_interval=epoch: NVIDIA's lr_cosine/linear/step_policy (image_classification/optimizers.py:93-130),
    which set the LR from the epoch alone: warmup base (e + 1) / W, then e = epoch - W over es = epochs - W."""
    base, steps = 0.0125, 7
    # qat_efficientnet_b0: 10 epochs, cosine, no warmup. Its mean LR is 0.55 x base, 10 % above the per-step 0.5.
    lrs = _lr_curve(70, 0, base, schedule="cosine", epochs=10, per_epoch=True)
    cosine = [base * 0.5 * (1 + math.cos(math.pi * e / 10)) for e in range(10)]
    assert _per_epoch(lrs, steps, 10) == pytest.approx(cosine, abs=1e-12)
    assert sum(lrs[:70]) / 70 == pytest.approx(0.55 * base)
    assert sum(_lr_curve(70, 0, base, schedule="cosine", epochs=10)[:70]) / 70 == pytest.approx(0.5 * base, rel=0.02)
    # qat_efficientnet_b4: 2 epochs, linear: base, then base / 2.
    assert _per_epoch(_lr_curve(14, 0, base, schedule="linear", epochs=2, per_epoch=True), steps, 2) == pytest.approx(
        [base, base / 2]
    )
    # A warmup of 2 of 8 epochs, cosine: base / 2, base, then the cosine from base over the 6 epochs after it.
    warm = _per_epoch(_lr_curve(56, 14, base, schedule="cosine", epochs=8, per_epoch=True), steps, 8)
    assert warm == pytest.approx([base / 2, base] + [base * 0.5 * (1 + math.cos(math.pi * e / 6)) for e in range(6)])
    # step: x0.1 from the first step of epoch 3 on (milestone 3), warmup 1 epoch.
    net = torch.nn.Linear(2, 2)
    opt = build_optimizer([{"params": net.parameters()}], _sgd(0.9), base)
    sched = EpochStartLR(build_scheduler(opt, 35, 7, 0.0, "step", milestones=(3,), epochs=5), 7, 1)
    lrs = [opt.param_groups[0]["lr"]]
    for step in range(1, 35):
        sched.step_update(num_updates=step)
        lrs.append(opt.param_groups[0]["lr"])
    assert _per_epoch(lrs, 7, 5) == pytest.approx([base, base, base, base / 10, base / 10])


@pytest.mark.parametrize("recipe", ["qat_efficientnet_b0", "qat_efficientnet_b4"])
def test_nvidias_pytorch_qat_recipes_change_the_lr_per_epoch(recipe: str) -> None:
    assert compose_config([f"recipe={recipe}"]).recipe.lr_interval == "epoch"
    assert compose_config(["recipe=90e"]).recipe.lr_interval == "step"


@pytest.mark.slow
def test_no_weight_decay_on_any_norm_parameter_or_bias() -> None:
    net = build_network(
        settings(ModelSchema, {"arch": "resnet50", "drop_rate": 0.0, "conv_init": "fan_in"}),
        num_classes=10,
    )
    groups = parameter_groups(net, weight_decay=1 / 32768)
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {id(p): n for n, p in net.named_parameters()}
    decayed_names = {names[i] for i in decayed}
    # The downsample BN is `layer1.0.downsample.1` -- NVIDIA's `"bn" in name` test decayed it.
    assert "layer1.0.downsample.1.weight" not in decayed_names
    assert "layer1.0.downsample.0.weight" in decayed_names  # the downsample conv is decayed
    for module_name, module in net.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            assert f"{module_name}.weight" not in decayed_names and f"{module_name}.bias" not in decayed_names
    assert "fc.bias" not in decayed_names and "fc.weight" in decayed_names
    assert all(
        names[i].endswith("weight") and p.ndim > 1
        for g in groups
        for p in g["params"]
        if g["weight_decay"] > 0
        for i in [id(p)]
    )
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(p.numel() for p in net.parameters())


def test_weight_decay_on_all_decays_everything() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    groups = parameter_groups(net, 0.1, "all")  # NVIDIA PyTorch --bn-weight-decay
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.1
    with pytest.raises(ConfigError, match="^recipe.weight_decay_on=bn must be one of conv_and_linear"):
        check_config(compose_config(["recipe.weight_decay_on=bn"]))  # up front; parameter_groups trusts it


def test_mixup_targets_are_smoothed_convex_combinations() -> None:
    torch.manual_seed(0)
    mixup = Mixup(mixup_alpha=0.2, label_smoothing=0.1, num_classes=10, mode="batch")
    images = torch.randn(8, 3, 4, 4)
    labels = torch.arange(8)
    mixed, targets = mixup(images.clone(), labels)
    assert targets.shape == (8, 10)
    assert torch.allclose(targets.sum(1), torch.ones(8))
    off = 0.1 / 10
    lam = (targets[0, 0] - off) / (1 - 0.1)  # sample 0's own label weight
    # partner of sample i is the flipped batch (7 - i); images mixed with the same lambda
    assert torch.allclose(mixed[0], lam * images[0] + (1 - lam) * images[7], atol=1e-5)
    assert targets[0, 7] == pytest.approx(float((1 - lam) * 0.9 + off), abs=1e-5)
    assert targets.min() >= off - 1e-6


def test_step_schedule_divides_by_ten_at_nvidias_epochs_30_60_80() -> None:
    # NVIDIA lr_step_policy (--lr-schedule step): warmup, then x0.1 at epochs 30, 60 and 80 (absolute epochs).
    total, warmup = 900, warmup_steps(900, 90, 8)
    lrs = _lr_curve(total, warmup, schedule="step", epochs=90, milestones=(30, 60, 80))  # recipe/90e.yaml's
    assert lrs[40] == pytest.approx(2.048 * 40 / 80) and lrs[80] == pytest.approx(2.048)
    assert lrs[299] == pytest.approx(2.048) and lrs[300] == pytest.approx(0.2048)
    assert lrs[599] == pytest.approx(0.2048) and lrs[600] == pytest.approx(0.02048)
    assert lrs[800] == pytest.approx(0.002048) and lrs[900] == pytest.approx(0.002048)


def test_linear_schedule_is_nvidias_base_times_one_minus_e_over_es() -> None:
    # NVIDIA lr_linear_policy: base * (1 - e/es), e = epoch - warmup, es = epochs - warmup (here per step).
    total, warmup = 900, 80
    lrs = _lr_curve(total, warmup, schedule="linear", epochs=90)
    for step in (80, 285, 490, 899, 900):
        assert lrs[step] == pytest.approx(2.048 * (1 - (step - 80) / 820), abs=1e-9)


def test_unknown_schedule_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^recipe.schedule=polynomial must be one of cosine, linear, step"):
        check_config(compose_config(["recipe.schedule=polynomial"]))  # up front; build_scheduler trusts it


def test_an_absolute_lr_overrides_the_per_256_rule() -> None:
    # NVIDIA's --lr 2.048 with --optimizer-batch-size 2048: recipe.lr, reported in the plan as is.
    plan = make_plan(per_device_batch=256, global_batch=2048, world_size=8, lr_per_256=0.256, weight_decay=0, lr=1.5)
    assert plan.lr == 1.5


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "interval"), [("step", "step"), ("linear", "step"), ("linear", "epoch")])
def test_training_follows_the_configured_schedule(
    schedule: str, interval: str, image_folder: Path, tmp_path: Path
) -> None:
    """recipe.schedule reaches the real training loop: 3 epochs of 6 steps at batch 8 (LR 0.008), no warmup;
    step decays x0.1 at epoch 1 and 2, linear ends each epoch at base x (1 - steps done / 18); per epoch
    (recipe.lr_interval=epoch) linear runs epoch e at base x (1 - e / 3)."""
    overrides = tiny_overrides(image_folder, f"recipe.schedule={schedule}", "recipe.lr_milestones=[1,2]",
                               "recipe.epochs=3", "recipe.warmup_epochs=0",
                               f"recipe.lr_interval={interval}")  # fmt: skip
    run(compose_config(overrides, run_dir=tmp_path))
    lrs = [row["train.lr"] for row in read_report(tmp_path)["epochs"]]
    base = 0.256 * 8 / 256
    if schedule == "step":  # the LR after each epoch's last step, i.e. the next epoch's first LR
        assert lrs == pytest.approx([base * 0.1, base * 0.01, base * 0.01])
    elif interval == "epoch":
        assert lrs == pytest.approx([base * 2 / 3, base / 3, 0.0], abs=1e-12)
    else:
        assert lrs == pytest.approx([base * (1 - 6 / 18), base * (1 - 12 / 18), 0.0], abs=1e-12)


def test_exponential_schedule_is_tf2s_staircase_decay_after_the_warmup() -> None:
    """NVIDIA TF2's default --lr_decay exponential, from TensorFlow's documented formulas: WarmupDecaySchedule
    (utils/learning_rate.py:50-63) is lr0 x step / warmup during the warmup, then ExponentialDecay(lr0, decay_steps
    = 2.4 epochs of steps, 0.97, staircase=True) (utils/optimizer_factory.py:329-334, runtime/runner_utils.py:89)
    of the step less the warmup: lr0 x 0.97 ** floor((step - warmup) / decay_steps)."""
    epochs, per_epoch, lr0 = 20, 10, 0.256
    total, warmup = epochs * per_epoch, 5 * per_epoch
    net = torch.nn.Linear(2, 2)
    opt = build_optimizer([{"params": net.parameters()}], _sgd(0.9), lr0)
    sched = build_scheduler(opt, total, warmup, 0.0, "exponential", epochs=epochs, decay_rate=0.97, decay_epochs=2.4)
    decay_steps = 2.4 * per_epoch
    for step in range(total + 1):
        if step:
            sched.step_update(num_updates=step)
        tf = lr0 * step / warmup if step < warmup else lr0 * 0.97 ** math.floor((step - warmup) / decay_steps)
        assert opt.param_groups[0]["lr"] == pytest.approx(tf, rel=1e-9, abs=1e-12), step
    assert opt.param_groups[0]["lr"] == pytest.approx(lr0 * 0.97**6)  # 150 steps after warmup: 6 whole stairs
    with pytest.raises(ConfigError, match="^recipe.lr_decay_rate=null must be set with recipe.schedule=exponential"):
        check_config(compose_config(["recipe.schedule=exponential"]))  # up front; build_scheduler trusts it
