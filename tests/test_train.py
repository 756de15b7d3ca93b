"""End-to-end training with the real Trainer, Hydra configs and JPEG files."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest
import torch

from imgcls.run.train import run
from tests.conftest import compose_config, read_report, run_cli, tiny_overrides

NVIDIA_NAMES = {
    "train.loss",
    "train.total_ips",
    "train.compute_ips",
    "train.data_time",
    "train.compute_time",
    "train.lr",
    "val.loss",
    "val.top1",
    "val.top5",
    "val.total_ips",
    "val.compute_ips",
}


@pytest.fixture(scope="module")
def trained(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    run(compose_config(tiny_overrides(image_folder), run_dir=run_dir))
    return run_dir


@pytest.mark.slow
def test_report_has_nvidia_metric_names_per_epoch_and_run(trained: Path) -> None:
    report = read_report(trained)
    assert [row["epoch"] for row in report["epochs"]] == [0, 1]
    for row in report["epochs"]:
        assert NVIDIA_NAMES <= set(row)
        assert 0 <= row["val.top1"] <= 100 and row["val.top5"] >= row["val.top1"]
        assert row["train.total_ips"] > 0 and row["train.compute_ips"] >= row["train.total_ips"] * 0.99
    run_summary = report["run"]
    assert run_summary["val.top1"] == max(r["val.top1"] for r in report["epochs"])
    assert run_summary["train.loss"] == min(r["train.loss"] for r in report["epochs"])  # a real min


@pytest.mark.slow
def test_run_dir_holds_config_logs_and_checkpoints(trained: Path) -> None:
    assert (trained / "checkpoints" / "last.ckpt").is_file()
    assert (trained / "checkpoints" / "best.ckpt").is_file()
    assert "resnet18" in (trained / "config.yaml").read_text()
    rows = list(csv.DictReader((trained / "csv" / "metrics.csv").open()))
    assert any(row.get("val.top1") for row in rows)


@pytest.mark.slow
def test_checkpoint_carries_classes_and_resolved_config(trained: Path) -> None:
    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["imgcls"]["classes"] == ["class_0", "class_1", "class_2"]
    assert ckpt["imgcls"]["arch"] == "test_resnet" and ckpt["imgcls"]["image_size"] == 32
    run_config = ckpt["hyper_parameters"]["run_config"]
    assert run_config["model"]["name"] == "resnet18" and run_config["precision"]["name"] == "fp32"
    assert "${" not in json.dumps(run_config)  # resolved, not interpolations
    assert ckpt["hyper_parameters"]["plan"]["accumulation"] == 1


@pytest.mark.slow
def test_best_checkpoint_holds_the_best_val_top1(trained: Path) -> None:
    best = torch.load(trained / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)
    callbacks = {k: v for k, v in best["callbacks"].items() if k.startswith("ModelCheckpoint")}
    score = next(v["best_model_score"] for v in callbacks.values() if v.get("best_model_score") is not None)
    assert float(score) == pytest.approx(read_report(trained)["run"]["val.top1"])


@pytest.mark.slow
def test_resume_from_last_continues_at_the_right_epoch_and_step(image_folder: Path, tmp_path: Path) -> None:
    full_dir, split_dir = tmp_path / "full", tmp_path / "split"
    args = tiny_overrides(image_folder, "recipe.epochs=3")
    run(compose_config(args, run_dir=full_dir))
    run(compose_config([*args, "trainer.max_epochs=2"], run_dir=split_dir))
    first = read_report(split_dir)
    assert [r["epoch"] for r in first["epochs"]] == [0, 1]
    run(compose_config([*args, "ckpt_path=last"], run_dir=split_dir))
    full, resumed = read_report(full_dir), read_report(split_dir)
    assert [r["epoch"] for r in resumed["epochs"]] == [0, 1, 2]  # the report continues
    assert resumed["epochs"][:2] == first["epochs"]
    assert [r["step"] for r in resumed["epochs"]] == [r["step"] for r in full["epochs"]]
    # The LR schedule spans recipe.epochs in both, so the LR at every epoch end is the same.
    assert [r["train.lr"] for r in resumed["epochs"]] == pytest.approx([r["train.lr"] for r in full["epochs"]])
    epochs_in_csv = {row["epoch"] for row in csv.DictReader((split_dir / "csv" / "metrics.csv").open())}
    assert epochs_in_csv == {"0", "1", "2"}  # one CSV log across the resume


@pytest.mark.slow
def test_weights_from_a_checkpoint_with_other_classes(trained: Path, tmp_path: Path) -> None:
    from tests.conftest import make_image_folder

    five = make_image_folder(tmp_path / "five", classes=5, train_per_class=4, val_per_class=2)
    ckpt = trained / "checkpoints" / "last.ckpt"
    run_dir = tmp_path / "finetune"
    run(compose_config(tiny_overrides(five, f"model.weights={ckpt}", "recipe.epochs=1"), run_dir=run_dir))
    tuned = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert tuned["state_dict"]["net.fc.weight"].shape[0] == 5


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "amp"])
def test_half_precision_on_cpu(image_folder: Path, tmp_path: Path, precision: str, caplog) -> None:
    cfg = compose_config(tiny_overrides(image_folder, f"precision={precision}", "recipe.epochs=1"), run_dir=tmp_path)
    summary = run(cfg)
    assert summary["val.top1"] >= 0
    if precision == "amp":  # fp16 AMP needs CUDA: the CPU run falls back to bf16, and says so
        assert any("falls back" in r.message or "bf16 autocast" in r.message for r in caplog.records)


@pytest.mark.slow
def test_synthetic_backend_needs_no_files(tmp_path: Path) -> None:
    cfg = compose_config(
        [
            "model=resnet18",
            "data=synthetic",
            "data.num_classes=4",
            "data.train_samples=32",
            "data.val_samples=16",
            "model.image_size=32",
            "data.batch_size=8",
            "recipe.global_batch_size=16",
            "recipe.epochs=1",
            "data.num_workers=0",
            "callbacks.progress_bar=none",
            "trainer.enable_progress_bar=false",
        ],
        run_dir=tmp_path,
    )
    run(cfg)
    row = read_report(tmp_path)["epochs"][0]
    assert row["step"] == 2  # 32 samples / 8 per batch / 2 accumulation
    assert row["val.top1"] >= 0


@pytest.mark.slow
def test_wandb_offline_writes_the_run(image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    run(compose_config(tiny_overrides(image_folder, "logger=wandb", "recipe.epochs=1"), run_dir=tmp_path))
    run_id = (tmp_path / "wandb_id.txt").read_text().strip()
    runs = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1
    # wandb-core keeps an offline run in its protobuf log (what `wandb sync` uploads); the metric
    # names, config values and W&B's own run-exit record must all be in it.
    log_file = runs[0] / f"run-{run_id}.wandb"
    expected = (b"val.top1", b"train.loss", b"train.total_ips", b"resnet18", b"run_config")
    # wandb-core flushes the log in the background after finish(): wait for every record checked (train.total_ips
    # is logged after val.top1, at the end of validation), bounded only against a hang.
    deadline = time.monotonic() + 60
    while not all(key in log_file.read_bytes() for key in expected) and time.monotonic() < deadline:
        time.sleep(0.5)
    log = log_file.read_bytes()
    for key in expected:
        assert key in log, key


@pytest.mark.slow
def test_demo_reaches_90_percent(tmp_path: Path) -> None:
    """`make train`: the embedded digits demo must reach >= 90% val top-1 on CPU."""
    result = run_cli(
        "train.py",
        "experiment=demo",
        f"hydra.run.dir={tmp_path / 'demo'}",
        "callbacks.progress_bar=none",
        env={"IMGCLS_CACHE": str(tmp_path / "cache")},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert read_report(tmp_path / "demo")["run"]["val.top1"] >= 90.0
    assert len(list((tmp_path / "cache" / "digits-jpeg" / "val").glob("*/*.jpg"))) == 355


def test_ckpt_path_last_without_a_checkpoint_starts_fresh(tmp_path: Path) -> None:
    from imgcls.training.checkpoint import resolve_ckpt_path

    assert resolve_ckpt_path("last", tmp_path) is None  # a requeued job's first start
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert resolve_ckpt_path("last", tmp_path) == str(tmp_path / "checkpoints" / "last.ckpt")
    assert resolve_ckpt_path(None, tmp_path) is None


@pytest.mark.slow
@pytest.mark.parametrize("change", ["recipe.epochs=3", "recipe.lr_per_256=0.5"])
def test_a_resume_that_changes_the_lr_schedule_is_refused(
    tmp_path_factory: pytest.TempPathFactory, image_folder: Path, tmp_path: Path, change: str
) -> None:
    """Lightning restores the LR schedule with the checkpoint: resumed with recipe.epochs=3 after a 2-epoch
    run, the third epoch trained at the finished cosine's LR 0, silently. Now one line, before any training."""
    from imgcls.errors import CheckpointError
    from tests.conftest import tiny_run

    last = tiny_run(tmp_path_factory, image_folder) / "checkpoints" / "last.ckpt"
    key = change.split("=")[0]
    overrides = tiny_overrides(image_folder, "recipe.ema_decay=0.9", f"ckpt_path={last}", change)
    with pytest.raises(CheckpointError, match=f"^{key}=.* but ckpt_path=.* trained with {key}="):
        run(compose_config(overrides, run_dir=tmp_path / "resumed"))
    assert not (tmp_path / "resumed" / "checkpoints" / "last.ckpt").exists()
