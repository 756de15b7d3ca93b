"""Hydra multirun through the real CLI: every job in its own run dir, a failed job does not stop or
poison the next, the exit code reports failures, in-process DDP sweeps are refused, the SLURM
launcher and the Optuna sweeper configs."""

from __future__ import annotations

import csv
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from tests import warm_python
from tests.conftest import CONF, ROOT, read_report, tiny_overrides

TIMEOUT = 900


def train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    return warm_python.run([ROOT / "train.py", *args], env=env, cwd=cwd, timeout=TIMEOUT)


def wandb_log(run_dir: Path, *expected: bytes) -> bytes:
    """The run's W&B log once it holds every one of `expected` (or after 60 s, bounding a hang only)."""
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    (offline,) = (run_dir / "wandb").glob(f"offline-run-*-{run_id}")
    log_file = offline / f"run-{run_id}.wandb"
    deadline = time.monotonic() + 60  # wandb-core flushes in the background after finish()
    while not all(key in log_file.read_bytes() for key in expected) and time.monotonic() < deadline:
        time.sleep(0.5)
    return log_file.read_bytes()


@pytest.mark.slow
def test_failed_job_does_not_stop_or_poison_the_next(image_folder: Path, tmp_path: Path) -> None:
    """Job 0 diverges (LR x 1e12: a NaN loss stops it mid-epoch, with its W&B run open); job 1 must still
    train, in its own run dir, into its own W&B run; the sweep exits with job 0's code (3)."""
    sweep = tmp_path / "sweep"
    args = tiny_overrides(image_folder, "recipe.epochs=1", "logger=wandb", f"hydra.sweep.dir={sweep}")
    result = train(tmp_path, "-m", *args, "recipe.lr_per_256=1e12,0.1")
    assert result.returncode == 3, result.stderr[-3000:]
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("imgcls: error: 1 sweep job(s) failed: job 0 (recipe.lr_per_256=1000000000000.0): train.loss is ")
    )
    assert "Traceback" not in result.stderr
    assert not (sweep / "0" / "report.json").exists() or not read_report(sweep / "0")["epochs"]
    assert read_report(sweep / "1")["epochs"][0]["val.top1"] >= 0
    ids = [(sweep / str(job) / "wandb_id.txt").read_text() for job in (0, 1)]
    assert ids[0] != ids[1]
    log = wandb_log(sweep / "1", b"val.top1", b"0.1")
    assert b"val.top1" in log and b"0.1" in log  # job 1's own run, with its own config


@pytest.mark.slow
def test_a_sweep_ends_with_its_results_table(image_folder: Path, tmp_path: Path) -> None:
    """After its jobs a sweep writes SWEEP_DIR/results.csv and prints the same table: per job the overrides that
    vary, the best val top-1 and its epoch (counted from 1, as the epoch lines count), the epochs trained, the exit
    code (3: job 0 diverged) and the run dir. Before, the sweep dir held only multirun.yaml."""
    sweep = tmp_path / "sweep"
    result = train(
        tmp_path, "-m", *tiny_overrides(image_folder, f"hydra.sweep.dir={sweep}"), "recipe.lr_per_256=1e12,0.5"
    )
    assert result.returncode == 3, result.stderr[-3000:]
    with (sweep / "results.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    report = read_report(sweep / "1")
    best = max(report["epochs"], key=lambda row: row["val.top1"])
    assert rows == [
        {"job": "0", "overrides": "recipe.lr_per_256=1000000000000.0", "best val.top1": "", "best epoch": "",
         "epochs": "0", "exit code": "3", "run dir": str(sweep / "0")},
        {"job": "1", "overrides": "recipe.lr_per_256=0.5", "best val.top1": str(best["val.top1"]),
         "best epoch": str(best["epoch"] + 1), "epochs": "2", "exit code": "0", "run dir": str(sweep / "1")},
    ]  # fmt: skip
    printed = [line.split() for line in result.stdout.splitlines()]
    assert ["job", "overrides", "best", "val.top1", "best", "epoch", "epochs", "exit", "code", "run", "dir"] in printed
    assert ["0", "recipe.lr_per_256=1000000000000.0", "-", "-", "0", "3", str(sweep / "0")] in printed
    assert [
        "1",
        "recipe.lr_per_256=0.5",
        f"{best['val.top1']:.2f}",
        str(best["epoch"] + 1),
        "2",
        "0",
        str(sweep / "1"),
    ] in printed
    assert result.stderr.strip().splitlines()[-1].startswith("imgcls: error: 1 sweep job(s) failed: job 0 ")


@pytest.mark.slow
def test_every_job_gets_its_own_run_dir(image_folder: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    args = tiny_overrides(image_folder, "recipe.epochs=1", f"hydra.sweep.dir={sweep}")
    result = train(tmp_path, "-m", *args, "seed=1,2")
    assert result.returncode == 0, result.stderr[-3000:]
    for job, seed in ((0, 1), (1, 2)):
        run_dir = sweep / str(job)
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == seed
        assert (run_dir / "checkpoints" / "last.ckpt").is_file() and read_report(run_dir)["epochs"]
    assert read_report(sweep / "0")["epochs"][0]["train.loss"] != read_report(sweep / "1")["epochs"][0]["train.loss"]


@pytest.mark.slow
def test_multirun_with_in_process_ddp_is_refused(image_folder: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    args = tiny_overrides(image_folder, "trainer.devices=2", "trainer.accelerator=cpu", f"hydra.sweep.dir={sweep}")
    result = train(tmp_path, "-m", *args, "seed=1,2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "imgcls: error: a multirun (-m) cannot start 2 DDP processes per job itself; sweep multi-GPU jobs with "
        "hydra/launcher=slurm, or launch each job as its own torchrun/srun run (docs/distributed.md)"
    )
    assert not list(sweep.rglob("report.json"))
    # A sweep of plans starts no process: 8-GPU experiments plan side by side
    plans = train(tmp_path, "-m", "mode=plan", "experiment=resnet50_dgxa100_amp_90e,tf2_efficientnet_b4_64xa100_amp",
                  f"hydra.sweep.dir={tmp_path / 'plans'}")  # fmt: skip
    assert plans.returncode == 0, plans.stderr[-3000:]
    world_sizes = [line.split()[1] for line in plans.stdout.splitlines() if line.startswith("world_size ")]
    assert world_sizes == ["8", "64"]


def test_slurm_launcher_runs_one_task_per_gpu() -> None:
    """hydra #2231: tasks_per_node must equal the GPUs per node for Lightning's SLURMEnvironment."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train", overrides=["hydra/launcher=slurm", "hardware=dgxa100", "trainer.num_nodes=2"],
            return_hydra_config=True,
        )  # fmt: skip
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.tasks_per_node == launcher.gpus_per_node == cfg.trainer.devices == 8
    assert launcher.nodes == 2 and launcher.signal_delay_s > 0
    from hydra.utils import get_class

    assert get_class(launcher._target_).__name__ == "SlurmLauncher"  # the plugin is installed


@pytest.mark.slow
def test_optuna_search_runs_trials_and_reports_the_best(tmp_path: Path) -> None:
    sweep = tmp_path / "optuna"
    args = [
        "hparams_search=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.n_startup_trials=2",
        f"hydra.sweep.dir={sweep}", "model=resnet18", "data=synthetic", "data.num_classes=3",
        "data.train_samples=16", "data.val_samples=8", "model.image_size=32", "data.batch_size=8",
        "recipe.global_batch_size=8", "recipe.epochs=1", "data.num_workers=0", "callbacks.progress_bar=none",
        "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
    ]  # fmt: skip
    result = train(tmp_path, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    lrs = [yaml.safe_load((sweep / str(j) / "config.yaml").read_text())["recipe"]["lr_per_256"] for j in (0, 1)]
    assert lrs[0] != lrs[1] and all(0.05 <= lr <= 0.5 for lr in lrs)
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    tops = [read_report(sweep / str(j))["run"]["val.top1"] for j in (0, 1)]
    assert best["best_value"] == pytest.approx(max(tops))
