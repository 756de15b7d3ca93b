"""The GPU acceptance script on a CPU machine: one line and exit 0; its plan covers every GPU path and each
planned command composes under Hydra and plans (check_devices=False) like the real run would."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
import torch

from imgcls.bench import gpu_check
from imgcls.config_checks import check_config
from imgcls.plan import resolve_plan
from imgcls.published_throughput import THROUGHPUT
from imgcls.trainer import check_trainer_args
from tests.conftest import ROOT, compose_config, tiny_overrides


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_cpu_machine_says_so_in_one_line_and_exits_0(tmp_path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "imgcls.bench.gpu_check"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == [
        "gpu_check: no CUDA GPU on this machine; nothing to check (python -m imgcls.bench.gpu_check --plan lists "
        "the checks)"
    ]
    assert list(tmp_path.iterdir()) == []  # no empty run folder left behind in the temp dir


def planned(capsys: pytest.CaptureFixture, *args: str) -> dict[str, list[str]]:
    assert gpu_check.main(["--plan", *args]) == 0
    rows = [line.split(": ", 1) for line in capsys.readouterr().out.strip().splitlines()]
    return {path: shlex.split(command) for path, command in rows}


@pytest.mark.slow
@pytest.mark.parametrize("hardware", ["dgxa100", "dgx1v"])
def test_plan_runs_every_gpu_path_and_each_command_composes(capsys, hardware: str) -> None:
    plan = planned(capsys, "--gpus", "8", "--hardware", hardware, "--data", "/data/imagenet")
    assert list(plan) == list(gpu_check.PATHS)
    configs = {}
    for path, command in plan.items():
        assert command[:2] == ["python", "train.py"], command
        cfg = compose_config(command[2:])
        check_config(cfg)
        check_trainer_args(dict(cfg.trainer))
        resolve_plan(cfg, check_devices=False)
        configs[path] = cfg
    amp = configs["amp+GradScaler"]
    assert amp.precision.loss_scale.init_scale == 128 and amp.mode == "train"
    assert configs["bf16"].precision.lightning == "bf16-mixed"
    assert (configs["fp32"].precision.tf32, configs["tf32"].precision.tf32) == (False, True)
    assert configs["channels_last"].model.channels_last and not configs["tf32"].model.channels_last
    assert configs["compile"].compile is True
    assert configs["dali_gpu"].data.backend == "dali_gpu" and configs["dali_gpu"].data.root == "/data/imagenet"
    assert configs["dali_cpu"].data.backend == "dali_cpu" and configs["dali_cpu"].data.pin_memory is True
    syncbn, ddp = configs["syncbn_efficientnet"], configs["ddp_nccl"]
    assert syncbn.model.arch == "efficientnet_b0" and syncbn.trainer.sync_batchnorm and syncbn.trainer.devices == 8
    # NVIDIA's TF2 recipe as it trains: RMSpropTF with EMA, AMP; on synthetic data
    assert (syncbn.recipe.optimizer, syncbn.recipe.ema_decay, syncbn.precision.name) == ("rmsprop_tf", 0.9999, "amp")
    assert syncbn.data.backend == "synthetic"
    assert ddp.trainer.devices == 8 and ddp.trainer.strategy == "ddp" and ddp.precision.name == "amp"
    assert ddp.recipe.ema_decay and amp.recipe.ema_decay and amp.trainer.limit_val_batches == 2  # EMA, validation
    benchmark = configs["resnet50_amp_benchmark"]
    assert (benchmark.mode, benchmark.model.arch, benchmark.precision.name) == ("benchmark", "resnet50", "amp")
    assert benchmark.hardware.name == hardware


def test_one_gpu_runs_the_ddp_rows_as_one_process(capsys: pytest.CaptureFixture) -> None:
    plan = planned(capsys, "--gpus", "1", "--hardware", "dgxa100")
    for path in ("syncbn_efficientnet", "ddp_nccl"):
        assert "trainer.devices=1" in plan[path] and "trainer.strategy=ddp" in plan[path]
    checks = {c.path: c for c in gpu_check.plan("dgxa100", 1, "/data", 40, "/tmp/x")}
    assert all(c.needs_gpus == 1 for c in checks.values())


def test_benchmark_pass_mark_is_nvidias_number_for_the_gpu() -> None:
    assert gpu_check.pass_mark("NVIDIA A100-SXM4-80GB", "dgxa100")[0] == 0.9
    assert gpu_check.pass_mark("Tesla V100-SXM2-16GB", "dgx1v")[0] == 0.9
    fraction, why = gpu_check.pass_mark("NVIDIA H200", "dgxa100")  # no NVIDIA row: at least the A100's
    assert fraction == 1.0 and "NVIDIA H200 is not the GPU" in why


@pytest.mark.slow
def test_a_check_runs_train_py_and_reads_its_report(image_folder, tmp_path) -> None:
    """The execution half on CPU: the amp+GradScaler check as a real train.py subprocess (fp16 autocast with
    GradScaler("cpu") stands in for CUDA), its row read from the run's report.json."""
    overrides = (
        *tiny_overrides(
            image_folder,
            "precision=amp",
            "precision.cpu_fp16=true",
            "trainer.max_steps=3",
            "recipe.epochs=1",
            "recipe.warmup_epochs=0",
        ),
        f"hydra.run.dir={tmp_path}/run",
    )
    row = gpu_check.execute(gpu_check.Check("amp+GradScaler", overrides), "cpu", gpus=1)
    assert row["status"] == "ok", row
    assert row["ips"] > 0 and row["note"].startswith("skipped steps 0, loss ")
    failing = gpu_check.execute(
        gpu_check.Check("bf16", (*overrides[:-1], "model.image_size=-5", f"hydra.run.dir={tmp_path}/bad")),
        "cpu",
        gpus=1,
    )
    assert failing["status"] == "FAILED" and failing["note"].startswith("exit 2: ")


def test_published_numbers_are_nvidias() -> None:
    """Each number next to ours is in NVIDIA's ResNet50 training-performance tables, on its GPU's row (the table
    itself: test_plan_mode.py::test_throughput_table_is_nvidias)."""
    reference = (ROOT / "docs" / "reference" / "nvidia-training-performance.md").read_text()
    rows = re.findall(r"^\|\s+(1|8)\s+\|\s+(\d+) img/s\s+\|\s+(\d+) img/s", reference, flags=re.M)[:6]
    expected = []
    for key in ("dgxa100", "dgx1v", "dgx1v_32g"):
        full = THROUGHPUT.get(("resnet50", key, "tf32")) or THROUGHPUT[("resnet50", key, "fp32")]
        amp = THROUGHPUT[("resnet50", key, "amp")]
        expected += [("1", str(full[1]), str(amp[1])), ("8", str(full[8]), str(amp[8]))]
    assert rows == expected and set(gpu_check.SOURCES) == {"dgxa100", "dgx1v", "dgx1v_32g"}
    assert gpu_check.hardware_for("NVIDIA A100-SXM4-80GB", 80) == "dgxa100"
    assert gpu_check.hardware_for("Tesla V100-SXM2-16GB", 16) == "dgx1v"
    assert gpu_check.hardware_for("Tesla V100-SXM2-32GB", 32) == "dgx1v_32g"


def test_table_marks_failures() -> None:
    rows = [
        {"path": "bf16", "status": "ok", "ips": 812.4, "published": None, "syncs": 0.0, "note": ""},
        {"path": "resnet50_amp_benchmark", "status": "FAILED", "ips": None, "published": 2470, "note": "exit 1: x"},
    ]
    text = gpu_check.table(rows, "A100", 8)
    assert "| bf16 | ok | 812 | - | 0.00 |  |" in text
    assert "| resnet50_amp_benchmark | FAILED | - | 2470 | - | exit 1: x |" in text
