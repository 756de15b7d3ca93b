"""The GPU acceptance script on a CPU machine: one line and exit 0; its dry run covers every GPU path and each
command composes under Hydra and plans (check_devices=False) like the real run would."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from imgcls.bench import bare_loop, gpu_check, overhead
from imgcls.config.checks import check_config
from imgcls.config.published import throughput_table
from imgcls.run.plan import resolve_plan
from imgcls.run.trainer import check_trainer_args
from tests import warm_python
from tests.conftest import ROOT, compose_config

THROUGHPUT = throughput_table()  # NVIDIA's training img/s: {(model, hardware, precision): {GPUs: img/s}}


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_cpu_machine_says_so_in_one_line_and_exits_0(tmp_path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "imgcls.bench.gpu_check"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == [
        "gpu_check: no CUDA GPU on this machine; nothing to check (python -m imgcls.bench.gpu_check --dry-run lists "
        "the checks)"
    ]
    assert list(tmp_path.iterdir()) == []  # no empty run folder left behind in the temp dir


def dry_run(capsys: pytest.CaptureFixture, *args: str) -> dict[str, list[str]]:
    assert gpu_check.main(["--dry-run", *args]) == 0
    rows = [line.split(": ", 1) for line in capsys.readouterr().out.strip().splitlines()]
    return {path: shlex.split(command) for path, command in rows}


@pytest.mark.slow
@pytest.mark.parametrize("hardware", ["dgxa100", "dgx1v"])
def test_dry_run_covers_every_gpu_path_and_each_command_composes(capsys, hardware: str) -> None:
    plan = dry_run(capsys, "--gpus", "8", "--hardware", hardware, "--data", "/data/imagenet")
    assert list(plan) == list(gpu_check.PATHS)
    configs = {}
    for path, command in plan.items():
        if path == "bare_loop":  # bench.overhead, not train.py: its flags, then train.py overrides
            # the loops apart, not interleaved (--chunk 0): on a GPU each loop's steps run asynchronously to its end
            assert command[:12] == ["python", "-m", "imgcls.bench.overhead", "--steps", "40", "--warmup", "10",
                                    "--repeats", "1", "--no-calls", "--chunk", "0"], command  # fmt: skip
            configs[path] = overhead.compose(command[12:], 40, 10, "/tmp/unused")
            continue
        if path == "cifar_bare_loop":  # bench.bare_loop: its own flags (test_cifar_bare_loop_matches_... checks them)
            assert command[:3] == ["python", "-m", "imgcls.bench.bare_loop"], command
            bare_loop.parser().parse_args(command[3:])
            continue
        if path == "dali_gpu_tests":
            assert command == ["python", "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                               "tests/test_dali_device_copies.py"]  # fmt: skip
            assert (ROOT / command[-1]).is_file()
            continue
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
    # dali_cpu's other train resize, in benchmark mode (so it has a host-syncs figure)
    resize = configs["dali_cpu_dali_resize"]
    assert (resize.data.backend, resize.data.dali_train_resize, resize.data.pin_memory) == ("dali_cpu", "dali", True)
    assert resize.mode == "benchmark" and configs["dali_cpu"].data.dali_train_resize == "auto"
    # a short real run of dali_cpu that validates: the validation loader's batches reach the GPU
    dali_train = configs["dali_cpu_train"]
    assert (dali_train.mode, dali_train.data.backend, dali_train.trainer.limit_val_batches) == ("train", "dali_cpu", 2)
    assert dali_train.trainer.limit_train_batches == 40 and dali_train.trainer.check_val_every_n_epoch == 1
    # NVIDIA's EfficientNet-B0 recipe with AutoAugment, on the given photos through dali_cpu, batch 256 on 1 GPU
    effnet = configs["dali_cpu_efficientnet"]
    assert (effnet.model.arch, effnet.data.augment, effnet.data.backend) == (
        "efficientnet_b0",
        "autoaugment",
        "dali_cpu",
    )
    assert (effnet.data.root, effnet.mode, effnet.trainer.devices) == ("/data/imagenet", "benchmark", 1)
    assert resolve_plan(effnet, check_devices=False).per_device_batch == 256
    for path in ("dali_gpu", "dali_cpu", "dali_cpu_dali_resize", "dali_cpu_efficientnet"):
        assert configs[path].mode == "benchmark" and configs[path].benchmark.iterations == 40, path
    syncbn, ddp = configs["syncbn_efficientnet"], configs["ddp_nccl"]
    assert syncbn.model.arch == "efficientnet_b0" and syncbn.trainer.sync_batchnorm and syncbn.trainer.devices == 8
    # NVIDIA's TF2 recipe as it trains: RMSpropTF with EMA, AMP; on synthetic data
    assert (syncbn.recipe.optimizer, syncbn.recipe.ema_decay, syncbn.precision.name) == ("rmsprop_tf", 0.9999, "amp")
    assert syncbn.data.backend == "synthetic"
    assert ddp.trainer.devices == 8 and ddp.trainer.strategy == "ddp" and ddp.precision.name == "amp"
    assert ddp.recipe.ema_decay and amp.recipe.ema_decay and amp.trainer.limit_val_batches == 2  # EMA, validation
    # the training row: one epoch of --steps batches, which ends, so it validates (max_steps would stop before)
    assert (amp.trainer.max_epochs, amp.trainer.limit_train_batches, amp.trainer.max_steps) == (1, 40, -1)
    assert amp.trainer.check_val_every_n_epoch == 1 and amp.trainer.val_check_interval is None
    # ddp_nccl: the single-GPU benchmark's batch on each of the 8 GPUs, no accumulation (its mark compares them)
    ddp_plan = resolve_plan(ddp, check_devices=False)
    assert (ddp_plan.per_device_batch, ddp_plan.accumulation, ddp.recipe.global_batch_size) == (256, 1, 2048)
    assert list(plan).index("resnet50_amp_benchmark") < list(plan).index("ddp_nccl")
    assert list(plan).index("bare_loop") == list(plan).index("resnet50_amp_benchmark") + 1
    benchmark = configs["resnet50_amp_benchmark"]
    assert (benchmark.mode, benchmark.model.arch, benchmark.precision.name) == ("benchmark", "resnet50", "amp")
    assert benchmark.hardware.name == hardware
    # the bare loop runs the benchmark row's network, batch and precision, one optimizer step a batch in both
    bare = configs["bare_loop"]
    plans = {name: resolve_plan(configs[name], check_devices=False) for name in ("resnet50_amp_benchmark", "bare_loop")}
    assert plans["resnet50_amp_benchmark"].as_dict() == plans["bare_loop"].as_dict()
    assert plans["bare_loop"].per_device_batch == 256 and plans["bare_loop"].accumulation == 1
    for key in (
        "model.arch",
        "model.image_size",
        "model.channels_last",
        "precision.name",
        "data.num_classes",
        "data.backend",
        "hardware.name",
        "trainer.devices",
        "trainer.accelerator",
        "recipe.optimizer",
    ):
        assert OmegaConf.select(bare, key) == OmegaConf.select(benchmark, key), key
    assert (bare.mode, bare.model.arch, bare.model.image_size, bare.data.num_classes) == (
        "benchmark",
        "resnet50",
        224,
        1000,
    )
    # one epoch of the CIFAR JPEGs: resnet18 at 32 px, AMP, torchvision loader, batch 256, validating a little
    cifar = configs["cifar_end_to_end"]
    assert (cifar.mode, cifar.model.arch, cifar.model.image_size, cifar.precision.name) == (
        "train",
        "resnet18",
        32,
        "amp",
    )
    assert (cifar.data.backend, cifar.data.root) == ("torchvision", "/data/imagenet")
    assert cifar.data.num_workers == gpu_check.loader_workers()
    assert (cifar.trainer.max_epochs, cifar.trainer.max_steps, cifar.trainer.limit_val_batches) == (1, -1, 4)
    assert cifar.trainer.check_val_every_n_epoch == 1 and cifar.trainer.devices == 1
    cifar_plan = resolve_plan(cifar, check_devices=False)
    assert (cifar_plan.per_device_batch, cifar_plan.accumulation) == (256, 1)


def test_one_gpu_runs_the_ddp_rows_as_one_process(capsys: pytest.CaptureFixture) -> None:
    plan = dry_run(capsys, "--gpus", "1", "--hardware", "dgxa100")
    for path in ("syncbn_efficientnet", "ddp_nccl"):
        assert "trainer.devices=1" in plan[path] and "trainer.strategy=ddp" in plan[path]
    checks = {c.path: c for c in gpu_check.checks("dgxa100", 1, "/data", 40, "/tmp/x")}
    assert all(c.needs_gpus == 1 for c in checks.values())
    # ddp_nccl on one GPU runs the single-GPU benchmark's batch: 256, no accumulation (the profile's 2048 would be 8)
    assert {"data.batch_size=256", "recipe.global_batch_size=256"} <= set(plan["ddp_nccl"])
    assert {"data.batch_size=256", "recipe.global_batch_size=256"} <= set(plan["resnet50_amp_benchmark"])


def test_benchmark_pass_mark_is_nvidias_number_for_the_gpu() -> None:
    assert gpu_check.pass_mark("NVIDIA A100-SXM4-80GB", "dgxa100")[0] == 0.9
    assert gpu_check.pass_mark("Tesla V100-SXM2-16GB", "dgx1v")[0] == 0.9
    fraction, why = gpu_check.pass_mark("NVIDIA H200", "dgxa100")  # no NVIDIA row: at least the A100's
    assert fraction == 1.0 and "NVIDIA H200 is not the GPU" in why


def small_on_cpu(overrides: tuple[str, ...], **replaced: str) -> tuple[str, ...]:
    """A planned GPU row's overrides made a seconds-long CPU run: `replaced` (dots as '__') swapped in, test_resnet
    at 32 px, batch 8, no loader workers, fp16 autocast with GradScaler("cpu") standing in for CUDA's."""
    small = {"data.batch_size": "8", "recipe.global_batch_size": "8", "model.arch": "test_resnet",
             "model.image_size": "32", "data.num_workers": "0", "precision.cpu_fp16": "true"}  # fmt: skip
    small.update({key.replace("__", "."): value for key, value in replaced.items()})
    kept = [o for o in overrides if o.split("=", 1)[0] not in small]
    return (*kept, *(f"{key}={value}" for key, value in small.items() if value is not None))


@pytest.mark.slow
def test_a_check_runs_train_py_and_reads_its_report(image_folder, tmp_path) -> None:
    """The execution half on CPU: the planned amp+GradScaler row (hardware=cpu, test_resnet, batch 8, 3 steps) as
    a real train.py subprocess; its row read from the run's report.json, which has validated the raw and the EMA
    weights. The old row's setting (trainer.max_steps inside an epoch) stops before validating: that fails."""
    planned_row = {c.path: c for c in gpu_check.checks("cpu", 1, str(image_folder), 3, str(tmp_path))}["amp+GradScaler"]
    assert {"recipe.epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
            "recipe.ema_decay=0.999"} <= set(planned_row.overrides)  # fmt: skip
    overrides = small_on_cpu(planned_row.overrides)
    with warm_python.as_sys_executable():  # gpu_check's `python train.py` processes
        row = gpu_check.execute(gpu_check.Check("amp+GradScaler", overrides), "cpu", gpus=1)
    assert row["status"] == "ok", row
    assert row["ips"] > 0 and row["syncs"] is None, row  # report.json has no host-syncs figure
    trained = r"skipped steps 0, loss \d+\.\d{3}, val\.top1 \d+\.\d%, val_ema\.top1 \d+\.\d%"
    assert re.fullmatch(trained, row["note"]), row
    document = json.loads((tmp_path / "amp_GradScaler" / "report.json").read_text())
    assert [epoch["step"] for epoch in document["epochs"]] == [3]  # 3 steps (of 6 batches), then validation
    stopped_early = small_on_cpu(planned_row.overrides, trainer__limit_train_batches=None, trainer__max_steps="3",
                                 hydra__run__dir=f"{tmp_path}/max_steps")  # fmt: skip
    with warm_python.as_sys_executable():
        unvalidated = gpu_check.execute(gpu_check.Check("amp+GradScaler", stopped_early), "cpu", gpus=1)
    assert unvalidated["status"] == "FAILED", unvalidated
    assert unvalidated["note"].startswith("missing or not finite in report.json's run summary: val.top1, val_ema.top1 ")
    bad = small_on_cpu(planned_row.overrides, model__image_size="-5", hydra__run__dir=f"{tmp_path}/bad")
    with warm_python.as_sys_executable():
        failing = gpu_check.execute(gpu_check.Check("bf16", bad), "cpu", gpus=1)
    assert failing["status"] == "FAILED" and failing["note"].startswith("exit 2: ")


def test_published_numbers_are_nvidias() -> None:
    """Each number next to ours is in NVIDIA's ResNet50 training-performance tables, on its GPU's row (the table
    itself: test_published_runs.py::test_pytorch_throughput_and_time_are_nvidias)."""
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


# --- the pass marks, on fabricated run outputs (run_process replaced: nothing runs) -------------------------------

H200 = "NVIDIA H200"  # no NVIDIA row: the resnet50 row's published mark is 1.0x the A100's 2470 img/s


def overhead_table(bare_ms: float, imgcls_ms: float, batch: int = 256) -> str:
    """bench.overhead's table as it prints it (test_parse_overhead_reads_the_real_table checks the format)."""
    return "\n".join([
        f"resnet50 @224 px, batch {batch}, precision=amp, gpu, 40 timed steps x 1 runs",
        "| loop | ms a step, median (min-max) | CPU ms a step | device ms a step | extra CPU ms over the bare loop "
        "| extra host ms over the bare loop | Python calls a step | extra calls over the bare loop |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| bare PyTorch loop | {bare_ms:.2f} ({bare_ms:.2f}-{bare_ms:.2f}) | 1.00 (1.00-1.00) | 39.00 (39.00-39.00) "
        "| +0.00 | +0.00 | - | - |",
        f"| imgcls (mode=benchmark) | {imgcls_ms:.2f} ({imgcls_ms:.2f}-{imgcls_ms:.2f}) | 2.00 (2.00-2.00) | - | "
        f"+1.00 | {imgcls_ms - bare_ms:+.2f} | - | - |",
    ])  # fmt: skip


class FakeRuns:
    """run_process for execute(): writes what a run would leave (report.json / benchmark.json in its
    hydra.run.dir, or bench.overhead's table on stdout) and records the commands."""

    def __init__(self, outputs: dict[str, Any], returncode: int = 0) -> None:
        self.outputs = outputs  # path (run dir name) -> document, or "overhead" -> table text
        self.returncode = returncode
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str], output: Any, timeout_s: float | None = None) -> int:
        self.commands.append(command)
        if "imgcls.bench.overhead" in command:
            output.write("some log line\n" + self.outputs["overhead"] + "\n")
        elif "imgcls.bench.bare_loop" in command or "pytest" in command:
            output.write(self.outputs[command[2]] + "\n")
        else:
            run_dir = Path(next(a.split("=", 1)[1] for a in command if a.startswith("hydra.run.dir=")))
            name, document = self.outputs[run_dir.name]
            (run_dir / name).write_text(json.dumps(document))
        return self.returncode


def checks(tmp_path: Path) -> dict[str, gpu_check.Check]:
    return {c.path: c for c in gpu_check.checks("dgxa100", 1, "/data/cifar", 40, str(tmp_path), workers=14)}


def report(total: float, compute: float, top1: float = 31.25) -> tuple[str, dict[str, Any]]:
    epoch = {"epoch": 0, "train.total_ips": total, "train.compute_ips": compute, "val.top1": top1, "train.loss": 2.1}
    return "report.json", {"epochs": [epoch], "run": {k: v for k, v in epoch.items() if k != "epoch"}}


def benchmark(total: float, compute: float, syncs: float) -> tuple[str, dict[str, Any]]:
    return "benchmark.json", {"train.total_ips": total, "train.compute_ips": compute,
                              "train.host_syncs_per_step": syncs, "cuda.tf32": 0.0}  # fmt: skip


def test_cifar_end_to_end_passes_at_total_90_percent_of_compute(tmp_path, monkeypatch) -> None:
    check = checks(tmp_path)["cifar_end_to_end"]
    assert "data.num_workers=14" in check.overrides and check.extra == {"total_vs_compute": 0.9}
    for total, status in ((11500, "ok"), (10800, "ok"), (10000, "FAILED")):  # of 12000 compute: 0.96, 0.90, 0.83
        fake = FakeRuns({"cifar_end_to_end": report(total, 12000)})
        monkeypatch.setattr(gpu_check, "run_process", fake)
        row = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200)
        assert row["status"] == status, row
        assert row["ips"] == total and row["syncs"] is None  # report.json has no host-syncs figure
        ratio = f"{total / 12000:.2f}"
        assert f"total {ratio}x compute ({total} of 12000 img/s, mark >= 0.90x)" in row["note"]
        assert row["note"].endswith("; val.top1 31.2% (the first 4 val batches, in class order: a smoke figure)")
        assert (": FAILED" in row["note"]) == (status == "FAILED")
        assert fake.commands[0][1] == str(ROOT / "train.py")


def test_cifar_end_to_end_without_compute_ips_fails(tmp_path, monkeypatch) -> None:
    name, document = report(11500, 12000)
    del document["run"]["train.compute_ips"]
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"cifar_end_to_end": (name, document)}))
    row = gpu_check.execute(checks(tmp_path)["cifar_end_to_end"], "dgxa100", 1, gpu_name=H200)
    assert row["status"] == "FAILED" and "no train.total_ips and train.compute_ips" in row["note"]


@pytest.mark.parametrize(
    ("total", "syncs", "status", "failing"),
    [
        (5900, 0.0, "ok", None),
        (5830, 0.1, "ok", None),  # 0.97x and 4 syncs in 40 steps: both marks exactly
        (5677, 0.0, "FAILED", "total 0.94x compute"),  # the H200's second run: 5677 of 6055 img/s
        (5900, 0.2, "FAILED", "host syncs 0.20 a step"),
    ],
)
def test_resnet50_benchmark_marks(tmp_path, monkeypatch, total: float, syncs: float, status: str, failing) -> None:
    compute = 6055 if total == 5677 else 6010
    monkeypatch.setattr(gpu_check, "run_process",
                        FakeRuns({"resnet50_amp_benchmark": benchmark(total, compute, syncs)}))  # fmt: skip
    row = gpu_check.execute(checks(tmp_path)["resnet50_amp_benchmark"], "dgxa100", 1, gpu_name=H200)
    assert row["status"] == status, row
    assert row["published"] == 2470 and row["syncs"] == syncs
    assert row["note"].startswith(f"NVIDIA A.2 DGX A100 (8x A100 80GB); {total / 2470:.2f}x of it, pass mark 1.00x")
    assert "mark >= 0.97x)" in row["note"] and f"host syncs {syncs:.2f} a step (mark <= 0.1)" in row["note"]
    if failing:
        assert f"{failing}" in row["note"] and row["note"].count(": FAILED") == 1
        assert row["note"].split(failing, 1)[1].split(";")[0].endswith(": FAILED")
    else:
        assert ": FAILED" not in row["note"]


def test_resnet50_benchmark_still_fails_below_nvidias_number(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"resnet50_amp_benchmark": benchmark(2400, 2450, 0)}))
    row = gpu_check.execute(checks(tmp_path)["resnet50_amp_benchmark"], "dgxa100", 1, gpu_name=H200)
    assert row["status"] == "FAILED" and "0.97x of it, pass mark 1.00x" in row["note"]
    assert ": FAILED" not in row["note"]  # its own marks (0.98x compute, no syncs) pass


@pytest.mark.parametrize("path", ["bf16", "syncbn_efficientnet", "ddp_nccl", "compile"])
def test_every_row_with_host_syncs_fails_past_0_1_a_step(tmp_path, monkeypatch, path: str) -> None:
    for syncs, status in ((0.0, "ok"), (0.1, "ok"), (0.2, "FAILED")):
        monkeypatch.setattr(gpu_check, "run_process", FakeRuns({path: benchmark(5000, 5100, syncs)}))
        row = gpu_check.execute(checks(tmp_path)[path], "dgxa100", 1, gpu_name=H200)
        assert row["status"] == status, row
        assert (
            f"host syncs {syncs:.2f} a step (mark <= 0.1)" + (": FAILED" if status == "FAILED" else "") in row["note"]
        )


def test_tf32_row_keeps_its_failure_and_marks_syncs(tmp_path, monkeypatch) -> None:
    name, document = benchmark(2000, 2100, 0.2)
    document["cuda.tf32"] = 0.0  # precision=tf32 left TF32 off: the row's own failure, and its syncs mark
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"tf32": (name, document)}))
    row = gpu_check.execute(checks(tmp_path)["tf32"], "dgxa100", 1, gpu_name=H200)
    assert row["status"] == "FAILED"
    assert (
        row["note"]
        == "TF32 in the training process was 0.0, expected 1.0; host syncs 0.20 a step (mark <= 0.1): FAILED"
    )


def trained(**changes: Any) -> tuple[str, dict[str, Any]]:
    """The training row's report.json: validated, with the EMA copy, and the GradScaler's count (`changes`: keys of
    the run summary with dots as '__'; None removes one)."""
    name, document = report(400, 450)
    document["run"].update({"train.amp_skipped_steps": 0, "val_ema.top1": 30.0})
    for key, value in changes.items():
        key = key.replace("__", ".")
        document["run"].pop(key) if value is None else document["run"].update({key: value})
    return name, document


def test_a_row_without_syncs_figure_has_no_syncs_mark(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"amp_GradScaler": trained()}))
    row = gpu_check.execute(checks(tmp_path)["amp+GradScaler"], "dgxa100", 1, gpu_name=H200)
    assert row == {"path": "amp+GradScaler", "status": "ok", "ips": 400, "published": None, "syncs": None,
                   "note": "skipped steps 0, loss 2.100, val.top1 31.2%, val_ema.top1 30.0%"}  # fmt: skip


def test_training_row_reports_host_syncs_when_its_report_has_them(tmp_path, monkeypatch) -> None:
    """The training rows count host syncs (callbacks.count_host_syncs, CUDA only): a training row carries report.json's
    figure and its mark."""
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"amp_GradScaler": trained(train__host_syncs_per_step=0.5)}))
    row = gpu_check.execute(checks(tmp_path)["amp+GradScaler"], "dgxa100", 1, gpu_name=H200)
    assert row["status"] == "FAILED" and row["syncs"] == 0.5
    assert row["note"].endswith("val_ema.top1 30.0%; host syncs 0.50 a step (mark <= 0.1): FAILED")


@pytest.mark.parametrize("path", ["amp+GradScaler", "cifar_end_to_end", "dali_cpu_train"])
def test_validating_rows_count_and_mark_validation_host_syncs(tmp_path, monkeypatch, path: str) -> None:
    """Every row that validates runs with callbacks.count_host_syncs=true, and a sync a validation step (MeanMetric's
    weight check, a `.item()` of the accuracy) fails it even when its training steps have none."""
    check = checks(tmp_path)[path]
    assert "callbacks.count_host_syncs=true" in check.overrides
    name, document = trained() if path == "amp+GradScaler" else report(11500, 12000)
    document["run"].update({"train.host_syncs_per_step": 0.0, "val.host_syncs_per_step": 3.0})
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({path.replace("+", "_"): (name, document)}))
    row = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200)
    assert row["status"] == "FAILED" and row["syncs"] == 0.0 and row["val_syncs"] == 3.0, row
    marks = "host syncs 0.00 a step (mark <= 0.1); host syncs 3.00 a validation step (mark <= 0.1): FAILED"
    assert marks in row["note"]
    assert "| 0.00 (val 3.00) |" in gpu_check.table([row], H200, 1)


@pytest.mark.parametrize(
    ("changes", "missing"),
    [
        ({"val__top1": None, "val_ema__top1": None}, "val.top1, val_ema.top1"),  # stopped before validating
        ({"val_ema__top1": None}, "val_ema.top1"),  # validated without the EMA copy
        ({"val_ema__top1": float("nan")}, "val_ema.top1"),
        ({"train__amp_skipped_steps": None}, "train.amp_skipped_steps"),
        ({"train__loss": float("inf")}, "train.loss"),
    ],
)
def test_training_row_fails_unless_it_validated_with_ema(tmp_path, monkeypatch, changes, missing: str) -> None:
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"amp_GradScaler": trained(**changes)}))
    row = gpu_check.execute(checks(tmp_path)["amp+GradScaler"], "dgxa100", 1, gpu_name=H200)
    assert row["status"] == "FAILED" and row["ips"] == 400, row
    assert row["note"] == (f"missing or not finite in report.json's run summary: {missing} (a GradScaler count, "
                           "a loss, validation of the raw and EMA weights)")  # fmt: skip


@pytest.mark.parametrize(
    ("gpus", "ratio", "status", "mark"),
    [
        (1, 0.96, "ok", "mark >= 0.95x"),
        (1, 0.95, "ok", "mark >= 0.95x"),
        (1, 0.90, "FAILED", "mark >= 0.95x"),
        (8, 0.92 * 8, "ok", "mark >= 0.90 x 8 = 7.20x"),
        (8, 0.90 * 8, "ok", "mark >= 0.90 x 8 = 7.20x"),
        (8, 0.85 * 8, "FAILED", "mark >= 0.90 x 8 = 7.20x"),
    ],
)
def test_ddp_row_scales_the_single_gpu_benchmark(tmp_path, monkeypatch, gpus: int, ratio, status, mark) -> None:
    """ddp_nccl (all ranks' img/s) against resnet50_amp_benchmark's on one GPU, the same batch 256 a GPU."""
    check = {c.path: c for c in gpu_check.checks("dgxa100", gpus, "/data", 40, str(tmp_path))}["ddp_nccl"]
    assert {f"trainer.devices={gpus}", "data.batch_size=256", f"recipe.global_batch_size={256 * gpus}"} <= set(
        check.overrides
    )
    single = 6000.0
    ddp_ips = ratio * single
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"ddp_nccl": benchmark(ddp_ips, ddp_ips * 1.02, 0.0)}))
    done = {"resnet50_amp_benchmark": {"path": "resnet50_amp_benchmark", "ips": single}}
    row = gpu_check.execute(check, "dgxa100", gpus, gpu_name=H200, done=done)
    assert row["status"] == status, row
    assert row["published"] == THROUGHPUT[("resnet50", "dgxa100", "amp")][gpus]
    gpus_text = "1 GPU" if gpus == 1 else f"{gpus} GPUs"
    expected = (f"{gpus_text} {ddp_ips:.0f} img/s = {ratio:.2f}x resnet50_amp_benchmark's 6000 ({mark})"
                + (": FAILED" if status == "FAILED" else ""))  # fmt: skip
    assert row["note"] == f"NVIDIA A.2 DGX A100 (8x A100 80GB); {expected}; host syncs 0.00 a step (mark <= 0.1)"


def test_ddp_row_without_the_single_gpu_row(tmp_path, monkeypatch) -> None:
    check = checks(tmp_path)["ddp_nccl"]
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"ddp_nccl": benchmark(5500, 5600, 0.0)}))
    alone = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200)  # --only ddp_nccl: nothing to compare
    assert alone["status"] == "ok", alone
    assert "no resnet50_amp_benchmark row in this run: mark >= 0.95x not checked" in alone["note"]
    failed = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200, done={"resnet50_amp_benchmark": {"ips": None}})
    assert failed["status"] == "FAILED"
    assert "resnet50_amp_benchmark has no img/s to compare with (mark >= 0.95x): FAILED" in failed["note"]


FAKE_TRAIN = """
import subprocess, sys, time
# a 'DDP rank' of this run: a grandchild of gpu_check, in the run's process group; it writes its pid when ready
subprocess.Popen(["sh", "-c", sys.argv[1] + "echo $$ > " + sys.argv[2] + ".tmp && mv " + sys.argv[2] + ".tmp "
                  + sys.argv[2] + " && exec sleep 600"])
time.sleep(600)
"""


def gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether process `pid` has ended within `within_s` (a zombie waiting for its reaper counts as ended)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_a_timeout_stops_the_rows_whole_process_group(tmp_path, monkeypatch, ignores_sigterm: bool) -> None:
    """A row past its time limit: FAILED, and every process it started is gone, not only the one gpu_check
    started (Lightning's other DDP ranks would hold their GPUs through the rows after it). One that ignores
    SIGTERM gets SIGKILL after the grace period."""
    monkeypatch.setattr(gpu_check, "KILL_GRACE_S", 1.0)
    script, pid_file = tmp_path / "fake_train.py", tmp_path / "grandchild.pid"
    script.write_text(FAKE_TRAIN)
    trap = "trap '' TERM; " if ignores_sigterm else ""
    check = gpu_check.Check("bf16", (trap, str(pid_file)), program=(str(script),), run_dir=str(tmp_path / "run"))
    # The row's time limit runs out once its grandchild is up, on any machine's speed: the wait with the row's
    # limit waits for the pid file (a 120 s bound catches a hang only), then reports the limit passed.
    real_wait = subprocess.Popen.wait

    def wait(process: subprocess.Popen, timeout: float | None = None) -> int:
        if timeout != 4:
            return real_wait(process, timeout=timeout)
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        raise subprocess.TimeoutExpired(process.args, timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", wait)
    row = gpu_check.execute(check, "dgxa100", 1, timeout_s=4, gpu_name=H200)
    assert pid_file.exists(), "the fake run did not start its grandchild"
    grandchild = int(pid_file.read_text())
    try:
        assert row["status"] == "FAILED" and row["note"].startswith("no result in 4 s, its process group stopped"), row
        assert gone(grandchild), f"process {grandchild} of the timed-out row still runs"
    finally:
        if not gone(grandchild, within_s=0):
            os.kill(grandchild, signal.SIGKILL)


def test_a_row_that_exits_leaves_no_process_behind(tmp_path) -> None:
    """A run whose own process exits while a child of it still runs (a rank that outlived rank 0): stopped too."""
    script, pid_file = tmp_path / "fake_train.py", tmp_path / "grandchild.pid"
    script.write_text(FAKE_TRAIN.replace("time.sleep(600)", "while not __import__('os').path.exists(sys.argv[2]): "
                                                            "time.sleep(0.05)\nsys.exit(3)"))  # fmt: skip
    check = gpu_check.Check("bf16", ("", str(pid_file)), program=(str(script),), run_dir=str(tmp_path / "run"))
    row = gpu_check.execute(check, "dgxa100", 1, timeout_s=60, gpu_name=H200)
    grandchild = int(pid_file.read_text())
    try:
        assert row["status"] == "FAILED" and row["note"].startswith("exit 3: "), row
        assert gone(grandchild), f"process {grandchild} of the row still runs"
    finally:
        if not gone(grandchild, within_s=0):
            os.kill(grandchild, signal.SIGKILL)


def test_bare_loop_row_compares_the_resnet50_row_with_the_bare_loop(tmp_path, monkeypatch) -> None:
    check = checks(tmp_path)["bare_loop"]
    assert check.command().startswith(
        "python -m imgcls.bench.overhead --steps 40 --warmup 10 --repeats 1 --no-calls --chunk 0 "
    )
    assert check.directory() == tmp_path / "bare_loop"
    # bare loop 40 ms a step at batch 256: 6400 img/s; bench.overhead's own imgcls loop 41 ms: 6244 img/s
    fake = FakeRuns({"overhead": overhead_table(40.0, 41.0)})
    monkeypatch.setattr(gpu_check, "run_process", fake)
    cases = ((6200, "ok", "0.97x"), (6080, "ok", "0.95x"), (5760, "FAILED", "0.90x"))  # 0.95x is the mark
    for ips, status, ratio in cases:
        done = {"resnet50_amp_benchmark": {"path": "resnet50_amp_benchmark", "ips": ips}}
        row = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200, done=done)
        assert row["status"] == status, row
        assert row["ips"] == pytest.approx(6400) and row["syncs"] is None and row["published"] is None
        assert row["note"] == (
            f"resnet50_amp_benchmark {ips} img/s = {ratio} the bare loop (mark >= 0.95x)"
            + (": FAILED" if status == "FAILED" else "")
            + "; cross-check, bench.overhead's own imgcls loop: 6244 img/s (0.98x the bare loop)"
        )
    assert fake.commands[0][1:3] == ["-m", "imgcls.bench.overhead"] and fake.commands[0][0] == sys.executable
    assert (tmp_path / "bare_loop" / "gpu_check.log").read_text().startswith("some log line\n")


def test_bare_loop_row_without_the_resnet50_row_or_its_table(tmp_path, monkeypatch) -> None:
    check = checks(tmp_path)["bare_loop"]
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"overhead": overhead_table(40.0, 41.0)}))
    alone = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200)  # --only bare_loop: nothing to compare
    assert alone["status"] == "ok" and alone["note"].startswith("no resnet50_amp_benchmark row in this run")
    failed = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200,
                               done={"resnet50_amp_benchmark": {"ips": None}})  # fmt: skip
    assert failed["status"] == "FAILED" and "has no img/s to compare" in failed["note"]
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"overhead": "Traceback: nothing printed"}))
    broken = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200, done={"resnet50_amp_benchmark": {"ips": 6000}})
    assert broken == {"path": "bare_loop", "status": "FAILED", "ips": None, "published": None, "syncs": None,
                      "note": "no bench.overhead table in the output"}  # fmt: skip
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"overhead": "boom"}, returncode=1))
    crashed = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200, done={"resnet50_amp_benchmark": {"ips": 6000}})
    assert crashed["status"] == "FAILED" and crashed["note"].startswith("exit 1: ")


def test_parse_overhead_reads_the_real_table(capsys) -> None:
    """bench.overhead run for real on the CPU (its default tiny network, a few steps): gpu_check reads its table."""
    assert overhead.main(["--steps", "3", "--warmup", "1", "--repeats", "1", "--no-calls", "--chunk", "0"]) == 0
    text = capsys.readouterr().out
    figures = gpu_check.parse_overhead("a log line\n" + text + "\nanother\n")
    assert figures["batch"] == 8 and figures["bare_ms"] > 0 and figures["imgcls_ms"] > 0
    assert figures["bare_device_ms"] != figures["bare_device_ms"]  # NaN: no CUDA events on the CPU
    assert figures["imgcls_device_ms"] > 0  # imgcls's own StepTimer reports its compute time, also on the CPU
    assert gpu_check.parse_overhead(overhead_table(40.0, 41.5)) == {
        "batch": 256, "bare_ms": 40.0, "bare_device_ms": 39.0, "imgcls_ms": 41.5, "imgcls_device_ms": pytest.approx(
            float("nan"), nan_ok=True)}  # fmt: skip


def pretend_one_h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """main() on this CPU machine as on one H200, with TMP/data's train/ and val/ and its run dirs under TMP/runs."""
    for split in ("train", "val"):
        (tmp_path / "data" / split).mkdir(parents=True)
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(gpu_check.torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(name=H200, total_memory=141 * 2**30))  # fmt: skip
    monkeypatch.setattr(gpu_check.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "runs"))


def test_main_runs_the_bare_loop_after_the_resnet50_row_and_exits_1_on_a_missed_mark(
    tmp_path, monkeypatch, capsys
) -> None:
    """main() on a pretend 1-GPU H200: the resnet50 row's img/s reach the bare_loop row; a missed mark exits 1."""
    pretend_one_h200(tmp_path, monkeypatch)
    argv = ["--data", str(tmp_path / "data"), "--only", "resnet50_amp_benchmark,bare_loop"]
    for resnet50_ips, code in ((6300, 0), (5760, 1)):
        fake = FakeRuns({"resnet50_amp_benchmark": benchmark(resnet50_ips, resnet50_ips + 50, 0.0),
                         "overhead": overhead_table(40.0, 41.0)})  # fmt: skip
        monkeypatch.setattr(gpu_check, "run_process", fake)
        assert gpu_check.main(argv) == code
        out = capsys.readouterr().out
        assert [c[1:3] for c in fake.commands] == [[str(ROOT / "train.py"), "model=resnet50"],
                                                  ["-m", "imgcls.bench.overhead"]]  # fmt: skip
        assert "| resnet50_amp_benchmark | ok | " in out
        assert f"| bare_loop | {'ok' if code == 0 else 'FAILED'} | 6400 | - | - | resnet50_amp_benchmark " in out


def test_main_runs_ddp_after_the_single_gpu_benchmark_and_exits_1_on_a_missed_mark(
    tmp_path, monkeypatch, capsys
) -> None:
    """main() on a pretend 1-GPU H200, --only naming ddp_nccl first: the single-GPU benchmark still runs before
    it, and its img/s reach the ddp_nccl row's mark."""
    pretend_one_h200(tmp_path, monkeypatch)
    argv = ["--data", str(tmp_path / "data"), "--only", "ddp_nccl,resnet50_amp_benchmark"]
    for ddp_ips, code in ((5800, 0), (5400, 1)):  # of 6000 img/s on one GPU: 0.97x, 0.90x (mark 0.95x)
        fake = FakeRuns({"resnet50_amp_benchmark": benchmark(6000, 6050, 0.0), "ddp_nccl": benchmark(ddp_ips, 6000, 0)})
        monkeypatch.setattr(gpu_check, "run_process", fake)
        assert gpu_check.main(argv) == code
        out = capsys.readouterr().out
        run_dirs = [
            next(Path(a.split("=", 1)[1]).name for a in c if a.startswith("hydra.run.dir=")) for c in fake.commands
        ]
        assert run_dirs == ["resnet50_amp_benchmark", "ddp_nccl"]
        assert f"| ddp_nccl | {'ok' if code == 0 else 'FAILED'} | {ddp_ips} | 2470 | 0.00 | " in out
        assert f"1 GPU {ddp_ips} img/s = {ddp_ips / 6000:.2f}x resnet50_amp_benchmark's 6000 (mark >= 0.95x)" in out


@pytest.mark.slow
def test_cifar_end_to_end_row_reads_a_real_report(image_folder, tmp_path) -> None:
    """The end-to-end row's command as a real train.py subprocess on CPU (hardware=cpu, a small batch): the report.json
    it writes has the figures the row reads (train.total_ips, train.compute_ips, val.top1)."""
    check = checks(tmp_path)["cifar_end_to_end"]
    replaced = {"hardware": "cpu", "data.root": str(image_folder), "data.num_workers": "1", "data.batch_size": "8",
                "recipe.global_batch_size": "8", "trainer.limit_val_batches": "2"}  # fmt: skip
    overrides = tuple(
        f"{key}={replaced[key]}" if (key := o.split("=", 1)[0]) in replaced else o for o in check.overrides
    )
    with warm_python.as_sys_executable():
        row = gpu_check.execute(gpu_check.Check(check.path, overrides, extra=check.extra), "cpu", gpus=1)
    assert row["ips"] > 0 and row["syncs"] is None, row
    assert re.fullmatch(
        r"total \d\.\d\dx compute \(\d+ of \d+ img/s, mark >= 0\.90x\)(: FAILED)?; "
        r"val\.top1 \d+\.\d% \(the first 4 val batches, in class order: a smoke figure\)",
        row["note"],
    ), row
    assert row["status"] == ("FAILED" if ": FAILED" in row["note"] else "ok")  # host timing on CPU: either


# --- the rows that catch a slow host path (issue 39) ----------------------------------------------------------------


def bare_loop_output(samples: int, wall_s: float) -> str:
    result = {"samples": samples, "steps": samples // 256, "wall_s": wall_s, "ips": samples / wall_s}
    return "loader warming up\nbare_loop: " + json.dumps(result)


def test_cifar_bare_loop_runs_after_the_cifar_row_with_its_composed_settings(tmp_path) -> None:
    planned = checks(tmp_path)
    assert list(planned).index("cifar_bare_loop") == list(planned).index("cifar_end_to_end") + 1
    bare = bare_loop.parser().parse_args(list(planned["cifar_bare_loop"].overrides))
    cfg = compose_config(list(planned["cifar_end_to_end"].overrides))
    plan = resolve_plan(cfg, check_devices=False)
    assert (bare.arch, bare.image_size, bare.data) == (cfg.model.arch, cfg.model.image_size, cfg.data.root)
    assert (bare.batch, plan.per_device_batch, plan.accumulation) == (256, 256, 1)
    assert (bare.workers, bare.prefetch) == (cfg.data.num_workers, cfg.data.prefetch_factor) == (14, 4)
    assert bare.channels_last is cfg.model.channels_last is True and cfg.data.pin_memory is True
    assert (bare.momentum, bare.label_smoothing) == (cfg.recipe.momentum, cfg.recipe.label_smoothing)
    assert (cfg.recipe.optimizer, cfg.precision.name, cfg.recipe.ema_decay) == ("sgd", "amp", None)
    assert cfg.data.augment is None and list(cfg.data.train_crop_scale) == [0.08, 1.0]  # bare: the same crop, no policy


@pytest.mark.parametrize(
    ("imgcls_ips", "status", "ratio"),
    [(10000, "ok", "1.00"), (9524, "ok", "1.05"), (6135, "FAILED", "1.63")],  # 1.63x: the trainer gap of issue 39
)
def test_cifar_bare_loop_marks_the_epoch_at_105_percent(tmp_path, monkeypatch, imgcls_ips, status, ratio) -> None:
    check = checks(tmp_path)["cifar_bare_loop"]
    fake = FakeRuns({"imgcls.bench.bare_loop": bare_loop_output(49920, 4.992)})  # 10000 img/s
    monkeypatch.setattr(gpu_check, "run_process", fake)
    row = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200, done={"cifar_end_to_end": {"ips": imgcls_ips}})
    assert row["status"] == status, row
    assert row["ips"] == pytest.approx(10000)
    assert row["note"] == (f"bare loop 49920 images in 5.0 s; cifar_end_to_end's epoch {ratio}x the bare loop's wall "
                           f"time a sample ({imgcls_ips} img/s, mark <= 1.05x)" + (": FAILED" if status == "FAILED"
                                                                                  else ""))  # fmt: skip
    assert fake.commands[0][:3] == [sys.executable, "-m", "imgcls.bench.bare_loop"]


def test_cifar_bare_loop_without_the_cifar_row_or_its_line(tmp_path, monkeypatch) -> None:
    check = checks(tmp_path)["cifar_bare_loop"]
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"imgcls.bench.bare_loop": bare_loop_output(49920, 5.0)}))
    alone = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200)
    assert (
        alone["status"] == "ok" and "no cifar_end_to_end row in this run: the 1.05x mark not checked" in alone["note"]
    )
    failed = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200, done={"cifar_end_to_end": {"ips": None}})
    assert failed["status"] == "FAILED" and "cifar_end_to_end has no img/s" in failed["note"]
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"imgcls.bench.bare_loop": "Traceback"}))
    broken = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200, done={"cifar_end_to_end": {"ips": 9000}})
    assert broken["status"] == "FAILED" and "no 'bare_loop: {...}' line" in broken["note"]


def test_bare_loop_trains_an_epoch_of_a_folder_and_prints_its_wall_time(image_folder, capsys) -> None:
    argv = ["--data", str(image_folder), "--arch", "test_resnet", "--image-size", "16", "--batch", "2",
            "--workers", "0", "--max-steps", "2"]  # fmt: skip
    assert bare_loop.main(argv) == 0
    figures = gpu_check.parse_bare_loop(capsys.readouterr().out)
    assert (figures["samples"], figures["steps"]) == (4, 2) and figures["wall_s"] > 0
    assert figures["ips"] == pytest.approx(4 / figures["wall_s"])


@pytest.mark.parametrize(("ips", "status"), [(2300, "ok"), (2241, "ok"), (2000, "FAILED")])  # 0.9 x 2489 = 2240.1
def test_dali_cpu_efficientnet_marks_nvidias_b0_throughput(tmp_path, monkeypatch, ips: float, status: str) -> None:
    check = checks(tmp_path)["dali_cpu_efficientnet"]
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"dali_cpu_efficientnet": benchmark(ips, 2600, 0.0)}))
    row = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200)
    assert row["status"] == status and row["published"] == 2489, row
    assert f"{ips / 2489:.2f}x NVIDIA's efficientnet_b0 amp 2489 img/s (mark >= 0.90x)" in row["note"]
    assert "host syncs 0.00 a step (mark <= 0.1)" in row["note"]


def test_dali_cpu_rows_have_the_host_syncs_mark(tmp_path, monkeypatch) -> None:
    for path in ("dali_cpu", "dali_cpu_dali_resize", "dali_cpu_efficientnet"):
        monkeypatch.setattr(gpu_check, "run_process", FakeRuns({path: benchmark(3000, 3100, 0.5)}))
        row = gpu_check.execute(checks(tmp_path)[path], "dgxa100", 1, gpu_name=H200)
        assert row["status"] == "FAILED" and "host syncs 0.50 a step (mark <= 0.1): FAILED" in row["note"], path


def test_dali_cpu_train_row_must_validate(tmp_path, monkeypatch) -> None:
    check = checks(tmp_path)["dali_cpu_train"]
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"dali_cpu_train": report(900, 1000, top1=12.5)}))
    row = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200)
    assert row["status"] == "ok" and row["note"] == "val.top1 12.5%", row
    name, document = report(900, 1000)
    del document["run"]["val.top1"]
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"dali_cpu_train": (name, document)}))
    row = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200)
    assert row["status"] == "FAILED" and "no finite val.top1 in report.json" in row["note"]


def test_dali_gpu_tests_row_runs_pytest_and_fails_with_it(tmp_path, monkeypatch) -> None:
    check = checks(tmp_path)["dali_gpu_tests"]
    fake = FakeRuns({"pytest": "...\n==== 7 passed in 12.3s ===="})
    monkeypatch.setattr(gpu_check, "run_process", fake)
    row = gpu_check.execute(check, "dgxa100", 1, gpu_name=H200)
    assert row["status"] == "ok" and row["note"] == "pytest -m gpu tests/test_dali_device_copies.py: 7 passed in 12.3s"
    assert fake.commands[0][:4] == [sys.executable, "-m", "pytest", "-m"]
    monkeypatch.setattr(gpu_check, "run_process", FakeRuns({"pytest": "1 failed, 6 passed in 9s"}, returncode=1))
    assert gpu_check.execute(check, "dgxa100", 1, gpu_name=H200)["status"] == "FAILED"


def test_dali_rows_fit_one_cifar_epoch_whatever_steps_says(tmp_path) -> None:
    planned = {c.path: c for c in gpu_check.checks("dgxa100", 1, "/data/cifar", 300, str(tmp_path), workers=14)}
    for path in ("dali_gpu", "dali_cpu", "dali_cpu_dali_resize", "dali_cpu_efficientnet"):
        assert "benchmark.iterations=185" in planned[path].overrides, path  # 10 warm-up + 185 = 195 batches of 256
    assert "benchmark.iterations=300" in planned["bf16"].overrides


def test_every_row_has_an_estimate_and_all_fit_ten_minutes(tmp_path, capsys) -> None:
    planned = gpu_check.checks("dgxa100", 8, "/data/cifar", 40, str(tmp_path))
    assert sorted(gpu_check.ESTIMATE_S) == sorted(gpu_check.PATHS) == sorted(c.path for c in planned)
    assert gpu_check.budget_s(planned) <= gpu_check.TOTAL_BUDGET_S == 600
    assert gpu_check.main(["--dry-run", "--gpus", "1", "--hardware", "dgxa100"]) == 0
    err = capsys.readouterr().err
    assert (
        f"18 rows, about {gpu_check.budget_s(planned) / 60:.1f} min on one H200 (an estimate, not a measurement" in err
    )
