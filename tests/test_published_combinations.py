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
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imgcls.plan import resolve_plan
from tests import warm_python
from tests.conftest import ROOT, clean_env, compose_config, free_port, make_image_folder

EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml") if not p.stem.startswith("_"))
CPU_PRECISION = {"amp": "amp", "bf16": "bf16"}  # any other (fp32, tf32) runs as fp32 on a CPU
CPU_BACKEND = {"dali_gpu": "dali_cpu"}


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
        overrides.append("precision.cpu_fp16=true")
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
    (tmp_path / "cases.json").write_text(json.dumps(overrides))
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
