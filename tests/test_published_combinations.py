"""Every feature combination of the published runs (conf/experiment/), together, on 2 gloo ranks.

Each experiment is reduced to what changes how a training step runs on several ranks: optimizer, EMA and its
warmup, mixup, cutmix, label smoothing, LR schedule, precision (as its CPU equivalent: amp -> fp16 autocast with
GradScaler("cpu"), bf16 -> bf16, tf32 -> fp32), gradient accumulation, stage-wise training, QAT and the data
backend (dali_gpu -> dali_cpu). An augmentation policy (AutoAugment, RandAugment) changes what an image looks like,
not how a step runs on several ranks: the first case with each policy and backend runs it, the later ones train
without it (a DALI policy's graph takes ~1.5 s to build at every fit). The first experiment of each distinct
combination runs as itself, scaled down (timm's test_resnet at 32 px, 4 images a rank, 2 optimizer steps an epoch),
on 2 DDP ranks: one validated epoch, last.ckpt, then a resume from it for one more epoch. Sync BN needs CUDA and is
left to make gpu-check. A new experiment is covered without editing this file: its combination is either already
run or a new case.

Why not a SIGKILL per case: a resume reads the same atomically written last.ckpt either way, and the kill
itself is tested in test_kill_resume.py and test_distributed.py; one process pair for all cases keeps the
test to about a minute instead of ~17 launches of ~10 s.

Beyond running, each fit of each case on each rank is checked for what it did (the script's Probe callback): both
ranks' parameters (network and EMA) bitwise equal; the logits' dtype and the precision plugin of the precision; the
backend class; the number of training batches (accumulation); with mixup, the recipe's Mixup (mode, alpha,
smoothing) in the module and network inputs that differ from the loaded images, without it none and the label
smoothing implied by each step's loss equal to the recipe's; with EMA, every update a lerp toward the network by the
decay of the recipe's schedule at that step, the EMA apart from both the network and the initial weights. For
RESUME_CASES the resumed run's weights equal an uninterrupted 2-epoch run's bitwise (optimizer, EMA, RNG and loader
state all carried). Each of these fails with its feature off: checked by disabling the EMA update, mixup
(mix_prob 0), the criterion's smoothing, the RNG or optimizer restore, and by perturbing one rank's weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgcls.run.plan import resolve_plan
from tests import warm_python
from tests.conftest import ROOT, clean_env, compose_config, free_port, make_image_folder

EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml") if not p.stem.startswith("_"))
CPU_PRECISION = {"amp": "amp", "bf16": "bf16"}  # any other (fp32, tf32) runs as fp32 on a CPU
CPU_BACKEND = {"dali_gpu": "dali_cpu"}
DTYPES = {"amp": "torch.float16", "bf16": "torch.bfloat16", "fp32": "torch.float32"}  # the logits' in training
BACKENDS = {"torchvision": ("TorchvisionBackend", None), "dali_cpu": ("DaliBackend", False)}
# Resumed and uninterrupted runs compared bitwise: EMA, per-sample mixup (the global RNG), RMSprop's state and DALI;
# the torchvision backend (its augmentation seeded per sample, so momentum SGD's state is what a bad resume loses).
RESUME_CASES = ["tf2_efficientnet_b4_8xa100_tf32", "demo"]


def combination(experiment: str) -> tuple[tuple[str, object], ...]:
    cfg = compose_config([f"experiment={experiment}"])
    recipe = cfg.recipe
    return (
        ("optimizer", str(recipe.optimizer)),
        ("ema", bool(recipe.get("ema_decay"))),
        ("ema_dynamic_decay", bool(recipe.get("ema_dynamic_decay"))),
        ("mixup", bool(recipe.get("mixup"))),
        ("cutmix", bool(recipe.get("cutmix"))),
        ("label_smoothing", bool(recipe.get("label_smoothing"))),
        ("schedule", str(recipe.schedule)),
        ("precision", CPU_PRECISION.get(str(cfg.precision.name), "fp32")),
        ("accumulation", resolve_plan(cfg, check_devices=False).accumulation > 1),
        ("stagewise", bool(recipe.get("stagewise"))),
        ("qat", bool(recipe.get("qat"))),
        ("backend", CPU_BACKEND.get(str(cfg.data.backend), str(cfg.data.backend))),
    )


def published_combinations() -> dict[str, tuple[tuple[str, object], ...]]:
    """The first experiment of each distinct combination, and the combination."""
    cases: dict[tuple, str] = {}
    for experiment in EXPERIMENTS:
        cases.setdefault(combination(experiment), experiment)
    return {experiment: features for features, experiment in cases.items()}


def augment_policy(experiment: str) -> str | None:
    return compose_config([f"experiment={experiment}"]).data.get("augment")


def scaled_down(experiment: str, features: dict[str, object], data: dict[bool, Path]) -> list[str]:
    accumulation = 2 if features["accumulation"] else 1
    overrides = [
        f"experiment={experiment}", "hardware=cpu", "trainer.accelerator=cpu", "trainer.devices=2",
        "trainer.num_nodes=1", "trainer.sync_batchnorm=false", "model.arch=test_resnet", "model.image_size=32",
        "model.weights=null", "data=folder", f"data.root={data[features['accumulation']]}",
        f"data.backend={features['backend']}", "data.num_workers=0", "data.batch_size=4",
        f"recipe.global_batch_size={8 * accumulation}", "recipe.epochs=3", "recipe.warmup_epochs=1",
        f"precision={features['precision']}", "callbacks.progress_bar=none", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false", "logger=csv", "callbacks.charts=false",
    ]  # fmt: skip
    if features["precision"] == "amp":
        # TF2's Keras loss scale starts at 2^15 (test_amp.py checks it): on this tiny fp16 network every one of the
        # test's 4 steps overflowed there and was skipped, as Keras skips them, so nothing trained. 128, the
        # PyTorch recipes' start, keeps the steps while the scaler stays in effect.
        overrides += ["precision.cpu_fp16=true", "precision.loss_scale.init_scale=128"]
    return overrides


@pytest.mark.slow
def test_every_published_combination_trains_validates_and_resumes_on_two_ranks(tmp_path: Path) -> None:
    cases = published_combinations()
    assert len(cases) >= 10  # the published runs' variety (17 when written): a broken reduction would show here
    # 2 optimizer steps an epoch on each rank: 16 training images (4 a rank, 2 ranks), 32 with accumulation 2
    data = {False: make_image_folder(tmp_path / "d16", classes=2, train_per_class=8, val_per_class=4),
            True: make_image_folder(tmp_path / "d32", classes=2, train_per_class=16, val_per_class=4)}  # fmt: skip
    overrides, augmented = {}, set()
    for name, features in cases.items():
        overrides[name] = scaled_down(name, dict(features), data)
        policy = (augment_policy(name), dict(features)["backend"])
        if policy in augmented:  # once per policy and backend: each DALI fit with a policy spends ~1.5 s on its graph
            overrides[name].append("data.augment=null")
        augmented.add(policy)
    uninterrupted = {name: overrides[name] for name in RESUME_CASES}
    (tmp_path / "cases.json").write_text(json.dumps({"cases": overrides, "uninterrupted": uninterrupted}))
    env = {**clean_env(), "MASTER_PORT": str(free_port())}
    result = warm_python.run([ROOT / "tests" / "published_combinations.py", str(tmp_path / "cases.json"),
                              str(tmp_path / "runs")], base_env=env, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    results = json.loads((tmp_path / "runs" / "results.json").read_text())
    assert set(results) == set(cases)
    for name, features in cases.items():
        got, f = results[name], dict(features)
        assert got["steps"] == [2, 4], (name, got)  # one epoch, then one more from last.ckpt
        assert got["validated_epochs"] == [0, 1], (name, got)
        assert got["finite"], (name, got)
        assert got["ema_in_checkpoint"] == f["ema"], (name, got)
        assert got["scaler_in_checkpoint"] == (f["precision"] == "amp"), (name, got)
        assert not got["charts"], (name, got)  # callbacks.charts=false: charts are not this test's subject
    probes = [json.loads((tmp_path / "runs" / f"probe_rank{rank}.json").read_text()) for rank in (0, 1)]
    for name, features in cases.items():
        check_behaviour(name, dict(features), probes)
    for name in RESUME_CASES:  # the resumed run ends where the uninterrupted one does, bitwise, on both ranks
        for probe in probes:
            resumed, whole = probe[f"{name}.resumed"], probe[f"{name}.uninterrupted"]
            assert resumed["net_hash"] == whole["net_hash"], (name, resumed, whole)
            assert resumed.get("ema_hash") == whole.get("ema_hash"), (name, resumed, whole)


def check_behaviour(name: str, f: dict[str, object], probes: list[dict]) -> None:
    """What each fit did on each rank (tests/published_combinations.py, Probe), against the experiment's recipe."""
    recipe = compose_config([f"experiment={name}"]).recipe
    for fit, steps in ((name, [1, 2]), (f"{name}.resumed", [3, 4])):
        facts = [probe[fit] for probe in probes]
        # DDP keeps the ranks' weights equal, bitwise
        assert facts[0]["net_hash"] == facts[1]["net_hash"], (fit, "ranks' weights differ")
        assert facts[0].get("ema_hash") == facts[1].get("ema_hash"), (fit, "ranks' EMA weights differ")
        for got in facts:
            assert got["net_moved"] > 0, (fit, got)
            assert got["batches"] == 2 * (2 if f["accumulation"] else 1), (fit, got)
            assert got["dtypes"] == [DTYPES[str(f["precision"])]], (fit, got)
            assert got["precision_plugin"] == ("Precision" if f["precision"] == "fp32" else "MixedPrecision"), got
            assert got["scaler"] == (f["precision"] == "amp"), (fit, got)
            assert (got["backend"], got["dali_gpu"]) == BACKENDS[str(f["backend"])], (fit, got)
            smoothing = float(recipe.label_smoothing)
            if f["mixup"]:
                mixup = {"mode": str(recipe.mixup_mode), "mixup_alpha": float(recipe.mixup),
                         "cutmix_alpha": float(recipe.get("cutmix") or 0), "label_smoothing": smoothing}  # fmt: skip
                assert got["mixup"] == mixup, (fit, got)
                assert got["mixed_batches"] >= 1 and all(got["soft_targets"]), (fit, got)
            else:
                assert got["mixup"] is None and got["mixed_batches"] == 0, (fit, got)
                assert not any(got["soft_targets"]), (fit, got)
                assert got["implied_smoothing"] == pytest.approx([smoothing] * got["batches"], abs=2e-3), (fit, got)
            if f["ema"]:
                assert got["ema_decay"] == float(recipe.ema_decay), (fit, got)
                assert [u[0] for u in got["ema_updates"]] == steps, (fit, got)
                expected = [
                    ema_decay(float(recipe.ema_decay), bool(f["ema_dynamic_decay"]), s, str(recipe.ema_ramp))
                    for s in steps
                ]
                observed = [(u[1], e) for u, e in zip(got["ema_updates"], expected) if u[1] is not None]
                # None: the network did not move at that step (step 1: warmup's LR 0), so no decay is observable
                assert observed, (fit, got)
                assert [o for o, _ in observed] == pytest.approx([e for _, e in observed], abs=1e-4), (fit, got)
                assert max(u[2] for u in got["ema_updates"]) < 1e-5, (fit, got)  # a lerp toward the network
                assert got["ema_vs_net"] > 0 and got["ema_vs_initial"] > 0, (fit, got)
            else:
                assert got["ema_decay"] is None and not got["ema_updates"], (fit, got)


def ema_decay(decay: float, dynamic: bool, step: int, ramp: str = "pytorch") -> float:
    """The EMA's decay at optimizer step `step` (1 = the first): NVIDIA's min(decay, (1 + t) / (10 + t)), t = step - 1
    (PyTorch) or step (TF2) (imgcls/training/ema.py); a fixed decay is timm's, which copies the weights first."""
    if dynamic:
        t = step - 1 if ramp == "pytorch" else step
        return min(decay, (1 + t) / (10 + t))
    return 0.0 if step <= 1 else decay
