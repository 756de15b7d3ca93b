"""GPU acceptance: every GPU path of imgcls for a few dozen steps, one table, non-zero exit on any failure.

    python -m imgcls.bench.gpu_check [--steps 40] [--data ROOT] [--dry-run]     (or: make gpu-check)

Each check is a real `python train.py ...` run in a subprocess (a fresh CUDA context per path; DDP launches
its own processes), in its own session (process group), with a time limit: past it (an NCCL hang) the row fails
and the whole group is stopped, SIGTERM then SIGKILL (run_process: DDP's other ranks and the loader workers too,
so no process of a timed-out row holds a GPU for the rows after it). Its whole log stays in its run dir; its
img/s, host syncs per step (torch's CUDA sync debug mode, in the training thread) and TF32 state come from
the run's benchmark.json / report.json. The training row (amp+GradScaler) is one epoch of --steps batches
that then validates (2 batches) with an EMA copy; the DDP rows (EMA; NVIDIA's TF2 EfficientNet with RMSpropTF,
EMA and sync BN) run on every visible GPU, as one DDP process on a 1-GPU machine. The resnet50 rows stand next
to NVIDIA's published training throughput for this GPU (docs/reference/nvidia-training-performance.md, ResNet50
v1.5), and the AMP benchmark must reach a pass mark of it (pass_mark). On a machine without CUDA it says so in
one line and exits 0; --dry-run prints the commands it would run (what tests/test_gpu_check.py checks on CPU).

Pass marks besides (each row's note says its marks and the figures):
- every row with a host-syncs figure: at most 0.1 host syncs a step (MAX_SYNCS_PER_STEP): the benchmark rows'
  timed steps (benchmark.json), and the training rows' training and validation steps apart (report.json's
  train/val.host_syncs_per_step: they run with callbacks.count_host_syncs=true, callbacks/host_syncs.py);
- amp+GradScaler: report.json's run summary has the GradScaler's skipped-step count and finite train.loss,
  val.top1 and val_ema.top1 (the run validated, with its EMA copy);
- ddp_nccl (synthetic resnet50 AMP, batch 256 a GPU as the single-GPU benchmark; it runs after it): its img/s
  (all ranks) >= 0.95 x resnet50_amp_benchmark's on one GPU (one DDP process), >= 0.9 x N x it on N > 1 GPUs;
- cifar_end_to_end (one epoch of resnet18 AMP at 32 px on the CIFAR JPEGs, torchvision loader, validation on;
  --steps does not shorten it): train.total_ips >= 0.9 x train.compute_ips of the epoch, from report.json;
- resnet50_amp_benchmark: train.total_ips >= 0.97 x train.compute_ips;
- bare_loop (`python -m imgcls.bench.overhead`: a bare PyTorch loop over the resnet50 AMP benchmark's network
  and batch, run right after it): the resnet50_amp_benchmark row's img/s >= 0.95 x the bare loop's; the mark
  sits on the bare_loop row, whose note also gives overhead's own imgcls row as a cross-check;
- cifar_bare_loop (`python -m imgcls.bench.bare_loop`, right after cifar_end_to_end: the same epoch in a plain
  PyTorch loop with the settings that row composes to): cifar_end_to_end's epoch wall time a sample <= 1.05x the
  bare loop's. Its steps are short, so host work imgcls adds shows (the resnet50 rows' ~43 ms steps hide it);
- dali_cpu_efficientnet (NVIDIA's EfficientNet-B0 recipe, AutoAugment on the host): img/s >= 0.9x NVIDIA's
  published one-GPU EfficientNet-B0 AMP img/s; dali_cpu_train (a short real run) must validate (finite val.top1);
  dali_gpu_tests is `pytest -m gpu tests/test_dali_device_copies.py`, failing with it.
The rows should take about ESTIMATE_S seconds each on one H200 (an estimate): within TOTAL_BUDGET_S in all.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from imgcls.config.hardware import hardware_for
from imgcls.config.published import throughput_table

ROOT = Path(__file__).resolve().parents[3]  # the source checkout holding train.py

# The ResNet50 v1.5 rows of NVIDIA's training throughput (imgcls/config/published_runs.csv) the rows compare with,
# named by their table in docs/reference/nvidia-training-performance.md.
SOURCES = {
    "dgxa100": "A.2 DGX A100 (8x A100 80GB)",
    "dgx1v": "A.2 DGX-1 16GB (8x V100 16GB)",
    "dgx1v_32g": "A.2 DGX-1 32GB (8x V100 32GB)",
}
# Every path the acceptance covers (the list); checks() must produce each (the tests assert it).
# In the order they run: the single-GPU resnet50 benchmark before the DDP rows (ddp_nccl is compared with it).
PATHS = (
    "amp+GradScaler", "bf16", "fp32", "tf32", "channels_last", "compile", "dali_gpu", "dali_cpu",
    "dali_cpu_dali_resize", "dali_cpu_train", "dali_cpu_efficientnet", "dali_gpu_tests",
    "resnet50_amp_benchmark", "bare_loop", "syncbn_efficientnet", "ddp_nccl", "cifar_end_to_end", "cifar_bare_loop",
)  # fmt: skip
# Seconds each row should take on one H200 at --steps 40, start-up included: an estimate, not a measurement. The
# nine rows that ran on an H200 (2026-11-26, docs/benchmarks.md) took 347 s together, about 32 s a row (compile
# ~90 s): a row costs its process's start (imports, CUDA context, cuDNN autotuning, workers), not its 50 steps.
# The total must stay within TOTAL_BUDGET_S, so that a GPU lent for 15 minutes (its start included) runs it once.
ESTIMATE_S = {
    "amp+GradScaler": 35, "bf16": 32, "fp32": 32, "tf32": 32, "channels_last": 32, "compile": 90, "dali_gpu": 25,
    "dali_cpu": 25, "dali_cpu_dali_resize": 25, "dali_cpu_train": 25, "dali_cpu_efficientnet": 25,
    "dali_gpu_tests": 30, "resnet50_amp_benchmark": 32, "bare_loop": 25, "syncbn_efficientnet": 32, "ddp_nccl": 32,
    "cifar_end_to_end": 30, "cifar_bare_loop": 20,
}  # fmt: skip
TOTAL_BUDGET_S = 600
CIFAR_EPOCH_MARK = 1.05  # cifar_end_to_end's epoch wall time a sample <= this x the bare loop's (cifar_bare_loop)
# NVIDIA's EfficientNet-B0 AMP throughput on one GPU of the profile (published_runs.csv): dali_cpu with its
# AutoAugment recipe must reach this fraction of it (a GPU DALI pipeline made NVIDIA's; here the host decodes and
# augments, so the mark is what a host-side regression would miss, not a measured figure of this path).
DALI_CPU_EFFICIENTNET_MARK = 0.9
DALI_BATCHES = 195  # the dali rows read the CIFAR train JPEGs at batch 256: warm-up + --steps must fit one epoch
MAX_SYNCS_PER_STEP = 0.1  # every row with a host-syncs figure fails past this
COMPARED = "resnet50_amp_benchmark"  # the row bare_loop (run right after it) and ddp_nccl compare with
DDP_ONE_PROCESS, DDP_PER_GPU = 0.95, 0.9  # ddp_nccl >= 0.95x COMPARED's img/s on 1 GPU, >= 0.9 x N x it on N
VALIDATED = ("val.top1", "val_ema.top1")  # the training row's report must have these (finite): it validated, with EMA
KILL_GRACE_S = 10.0  # a timed-out row's process group: seconds from SIGTERM to SIGKILL (and to wait after it)
OVERHEAD = ("-m", "imgcls.bench.overhead")  # the bare_loop row's program (not train.py)
BARE_LOOP = ("-m", "imgcls.bench.bare_loop")  # the cifar_bare_loop row's program
PYTEST = ("-m", "pytest")  # the dali_gpu_tests row's program
DALI_GPU_TESTS = ("-m", "gpu", "-q", "-p", "no:cacheprovider", "tests/test_dali_device_copies.py")
VAL_BATCHES = 4  # the end-to-end row's validation: a few batches (their wall time counts in its train wall on CUDA)
CIFAR_ROW = "cifar_end_to_end"  # the row cifar_bare_loop (run right after it) compares with
BARE, IMGCLS = "bare PyTorch loop", "imgcls (mode=benchmark)"  # bench.overhead's table rows


@dataclass(frozen=True)
class Check:
    path: str  # one of PATHS
    overrides: tuple[str, ...]
    published: tuple[str, int] | None = None  # (precision, GPU count) of NVIDIA's ResNet50 throughput
    needs_gpus: int = 1
    extra: dict[str, Any] = field(default_factory=dict)  # tf32, assert, total_vs_compute, versus_bare_loop
    program: tuple[str, ...] = ("train.py",)  # or OVERHEAD
    run_dir: str | None = None  # where its log goes; None: the hydra.run.dir override

    def command(self) -> str:
        return shlex.join(["python", *self.program, *self.overrides])

    def directory(self) -> Path:
        if self.run_dir is not None:
            return Path(self.run_dir)
        return Path(next(o.split("=", 1)[1] for o in self.overrides if o.startswith("hydra.run.dir=")))


def loader_workers() -> int:
    """data.num_workers of the end-to-end row: the cores this process may use minus 2 (the training process and
    its pin-memory thread), at most 32 (a 1-GPU row on a 128-core host needs no 126 worker processes)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores - 2, 32))


def checks(
    hardware: str, gpus: int, data_root: str, steps: int, run_root: str, workers: int | None = None
) -> list[Check]:
    """The checks for `gpus` visible GPUs of `hardware`, each a train.py (or bench.overhead) command line;
    `workers`: the end-to-end row's data.num_workers (None: loader_workers())."""

    def run(
        path: str, *overrides: str, devices: int = 1, mode: str = "benchmark", iterations: int | None = None
    ) -> tuple[str, ...]:
        common = [
            f"hardware={hardware}", f"trainer.devices={devices}", "callbacks.progress_bar=none",
            "trainer.enable_progress_bar=false", f"hydra.run.dir={run_root}/{path.replace('+', '_')}",
        ]  # fmt: skip
        if mode == "benchmark":
            common += ["mode=benchmark", "benchmark.warmup=10", f"benchmark.iterations={iterations or steps}"]
        elif mode == "epoch":  # one whole epoch of a real training run, batch 256, a few val batches
            common += [
                "callbacks.count_host_syncs=true",
                "recipe.epochs=1",
                "recipe.warmup_epochs=0",
                f"trainer.limit_val_batches={VAL_BATCHES}",
                "data.batch_size=256",
                "recipe.global_batch_size=256",
            ]
        else:  # a real training run (checkpoints, report.json with the scaler's skipped steps), no accumulation:
            # one epoch cut to `steps` batches, so that it ends and validates (max_steps would stop before that)
            common += [
                "callbacks.count_host_syncs=true",
                "recipe.epochs=1",
                f"trainer.limit_train_batches={steps}",
                "trainer.limit_val_batches=2",
                "recipe.warmup_epochs=0",
                "data.batch_size=128",
                "recipe.global_batch_size=128",
            ]
        return (*overrides, *common)

    synthetic = ("data=synthetic",)
    dali_steps = min(steps, DALI_BATCHES - 10)
    full = "tf32" if hardware == "dgxa100" else "fp32"  # the full-precision column NVIDIA published
    photos = ("data=folder", f"data.root={data_root}")
    return [
        # torchvision here: a hardware profile may default to DALI, which has its own two rows below
        Check("amp+GradScaler", run("amp+GradScaler", "model=resnet50", "precision=amp", *photos,
                                    "data.backend=torchvision", "recipe.ema_decay=0.999", mode="train")),
        Check("bf16", run("bf16", "model=resnet50", "precision=bf16", *synthetic)),
        Check("fp32", run("fp32", "model=resnet50", "precision=fp32", *synthetic), ("fp32", 1), extra={"tf32": 0.0}),
        Check("tf32", run("tf32", "model=resnet50", "precision=tf32", *synthetic), ("tf32", 1),
              extra={"assert": "tf32_changes_results", "tf32": 1.0}),
        # NHWC without autocast (the amp rows are NHWC already): compare with the tf32/fp32 row (NCHW).
        Check("channels_last", run("channels_last", "model=resnet50", f"precision={full}",
                                   "precision.channels_last=true", *synthetic)),
        Check("compile", run("compile", "model=resnet50", "precision=amp", "compile=true", *synthetic)),
        Check("dali_gpu", run("dali_gpu", "model=resnet50", "precision=amp", *photos, "data.backend=dali_gpu",
                              iterations=dali_steps)),
        # The dali rows read one epoch of the photos (195 batches of the CIFAR train JPEGs): warm-up + timed
        # iterations must fit it (mode=benchmark times one epoch), whatever --steps says.
        Check("dali_cpu", run("dali_cpu", "model=resnet50", "precision=amp", *photos, "data.backend=dali_cpu",
                              "data.pin_memory=true", iterations=dali_steps)),
        # DALI's own CPU resize (the row above: ROI decode, torch resize): the other dali_cpu train path.
        Check("dali_cpu_dali_resize", run("dali_cpu_dali_resize", "model=resnet50", "precision=amp", *photos,
                                          "data.backend=dali_cpu", "data.dali_train_resize=dali",
                                          "data.pin_memory=true", iterations=dali_steps)),
        # A short real training run, so that the validation loader's batches reach the GPU too (benchmark
        # mode never validates); the mark: a finite val.top1.
        Check("dali_cpu_train", run("dali_cpu_train", "model=resnet50", "precision=amp", *photos,
                                    "data.backend=dali_cpu", "data.pin_memory=true", mode="train"),
              extra={"validated": ("val.top1",)}),
        # NVIDIA's EfficientNet-B0 recipe (AutoAugment v0: DALI's resize and augmentation on the host) at batch 256
        # on one GPU: its img/s against NVIDIA's published one-GPU figure for the profile.
        Check("dali_cpu_efficientnet", run("dali_cpu_efficientnet", "experiment=efficientnet_b0_dgxa100_amp_400e",
                                           *photos, "data.backend=dali_cpu", "data.pin_memory=true",
                                           "data.batch_size=256", "recipe.global_batch_size=256",
                                           iterations=dali_steps),
              extra={"versus_published": ("efficientnet_b0", "amp", DALI_CPU_EFFICIENTNET_MARK)}),
        # The GPU-only tests of the DALI batches copied ahead onto the device (they skip on a CPU machine).
        Check("dali_gpu_tests", DALI_GPU_TESTS, program=PYTEST, run_dir=f"{run_root}/dali_gpu_tests"),
        # Batch 256 with no accumulation (the profile's global 2048 would step the optimizer every 8th
        # micro-batch on one GPU): NVIDIA's 1-GPU measurement, and the bare_loop row's work step for step.
        Check("resnet50_amp_benchmark", run("resnet50_amp_benchmark", "model=resnet50", "precision=amp",
                                            *synthetic, "data.batch_size=256", "recipe.global_batch_size=256"),
              ("amp", 1), extra={"total_vs_compute": 0.97}),
        # Right after it on the same GPU: a bare PyTorch loop over the same network and batch (bench.overhead's
        # defaults are test_resnet at 8 px, 10 classes: model.arch and data.num_classes are named here), each loop
        # on its own (--chunk 0: not interleaved, so that each one's steps run ahead of the GPU until its end).
        Check("bare_loop", ("--steps", str(steps), "--warmup", "10", "--repeats", "1", "--no-calls", "--chunk", "0",
                            "model=resnet50", "model.arch=resnet50", "model.image_size=224", "precision=amp",
                            "data.num_classes=1000", "data.batch_size=256", "recipe.global_batch_size=256",
                            f"hardware={hardware}", "trainer.devices=1"),
              extra={"versus_bare_loop": 0.95}, program=OVERHEAD, run_dir=f"{run_root}/bare_loop"),
        # DDP rows on every visible GPU (one process on a 1-GPU machine: still DDP, NCCL and the EMA copy).
        # NVIDIA's TF2 EfficientNet as it trains: RMSpropTF, EMA 0.9999, sync BN, AMP with loss scaling.
        Check("syncbn_efficientnet", run("syncbn_efficientnet", "experiment=tf2_efficientnet_b0_8xa100_amp",
                                         "trainer.sync_batchnorm=true", "trainer.strategy=ddp", *synthetic,
                                         "data.batch_size=256", f"recipe.global_batch_size={256 * gpus}",
                                         devices=gpus)),  # 256 a GPU like the resnet50 rows, not the recipe's 1024
        # The resnet50 benchmark's batch on each GPU, no accumulation (the profile's global 2048 would accumulate 8
        # micro-batches on one GPU): its img/s against resnet50_amp_benchmark's, which ran before it.
        Check("ddp_nccl", run("ddp_nccl", "model=resnet50", "precision=amp", "trainer.strategy=ddp",
                              "recipe.ema_decay=0.9999", *synthetic, "data.batch_size=256",
                              f"recipe.global_batch_size={256 * gpus}", devices=gpus), ("amp", gpus),
              extra={"versus_single_gpu": (DDP_ONE_PROCESS, DDP_PER_GPU)}),
        # The CIFAR JPEGs end to end: one epoch (195 steps of 256, whatever --steps says) through the torchvision
        # loader (uint8 batches normalized on the device), validating, writing report.json and a checkpoint.
        Check("cifar_end_to_end", run("cifar_end_to_end", "model=resnet18", "model.image_size=32", "precision=amp",
                                      *photos, "data.backend=torchvision",
                                      f"data.num_workers={workers or loader_workers()}", mode="epoch"),
              extra={"total_vs_compute": 0.9}),
        # Right after it, on the same GPU and JPEGs: the same epoch in a plain PyTorch loop (bench.bare_loop) with
        # the settings cifar_end_to_end composes to (tests/test_gpu_check.py compares them); the host work imgcls
        # adds a step shows in the epoch's wall time, which the resnet50 rows' ~43 ms steps would hide.
        Check("cifar_bare_loop", ("--data", data_root, "--arch", "resnet18", "--image-size", "32", "--batch", "256",
                                  "--workers", str(workers or loader_workers()), "--prefetch", "4", "--channels-last",
                                  "--momentum", "0.875", "--label-smoothing", "0.1"),
              extra={"versus_cifar_epoch": CIFAR_EPOCH_MARK}, program=BARE_LOOP,
              run_dir=f"{run_root}/cifar_bare_loop"),
    ]  # fmt: skip


def tf32_changes_results() -> float:
    """Max |conv(TF32) - conv(FP32)| on the GPU through imgcls.training.precision.set_tf32: 0 would mean the
    precision=tf32 switch does nothing on this GPU (pre-Ampere GPUs have no TF32: then it is 0 by design)."""
    from imgcls.training.precision import set_tf32

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(32, 256, 28, 28, device="cuda", generator=gen)
    w = torch.randn(256, 256, 3, 3, device="cuda", generator=gen)
    outputs = []
    for enabled in (False, True):
        set_tf32(enabled)
        outputs.append(torch.nn.functional.conv2d(x, w, padding=1))
    set_tf32(False)
    return float((outputs[0] - outputs[1]).abs().max())


def _result(run_dir: Path) -> dict[str, Any]:
    for name in ("benchmark.json", "report.json"):
        if (run_dir / name).is_file():
            document = json.loads((run_dir / name).read_text())
            return document.get("run", {}) if name == "report.json" else document
    return {}


def _mark(row: dict[str, Any], passed: bool, text: str) -> None:
    """Append a pass mark's figures to the row's note; a missed mark fails the row."""
    row["note"] = (row["note"] + "; " if row["note"] else "") + text + ("" if passed else ": FAILED")
    if not passed:
        row["status"] = "FAILED"


def _mark_syncs(row: dict[str, Any]) -> None:
    for key, what in (("syncs", "a step"), ("val_syncs", "a validation step")):
        if row.get(key) is not None:
            syncs = float(row[key])
            _mark(
                row, syncs <= MAX_SYNCS_PER_STEP + 1e-9, f"host syncs {syncs:.2f} {what} (mark <= {MAX_SYNCS_PER_STEP})"
            )


def _finite(value: Any) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _mark_trained(row: dict[str, Any], summary: dict[str, Any]) -> None:
    """The training row: the GradScaler's skipped-step count, a finite loss, and the validation of the raw
    and the EMA weights (val.top1, val_ema.top1) in report.json's run summary; anything missing fails it."""
    missing = [key for key in ("train.amp_skipped_steps", "train.loss", *VALIDATED) if not _finite(summary.get(key))]
    if missing:
        what = "a GradScaler count, a loss, validation of the raw and EMA weights"
        row.update(status="FAILED", note=f"missing or not finite in report.json's run summary: {', '.join(missing)} "
                                         f"({what})")  # fmt: skip
        return
    skipped, loss = summary["train.amp_skipped_steps"], float(summary["train.loss"])
    top1, ema_top1 = (float(summary[key]) for key in VALIDATED)
    row["note"] = f"skipped steps {skipped}, loss {loss:.3f}, val.top1 {top1:.1f}%, val_ema.top1 {ema_top1:.1f}%"


def _mark_versus_single_gpu(
    row: dict[str, Any], gpus: int, marks: tuple[float, float], done: dict[str, dict[str, Any]]
) -> None:
    """ddp_nccl's img/s (all ranks) against resnet50_amp_benchmark's on one GPU (`done`: the rows run before):
    >= marks[0] x it with one DDP process, >= marks[1] x gpus x it on several GPUs."""
    one, per_gpu = marks
    fraction = one if gpus == 1 else per_gpu * gpus
    mark = f"mark >= {one:.2f}x" if gpus == 1 else f"mark >= {per_gpu:.2f} x {gpus} = {fraction:.2f}x"
    compared = done.get(COMPARED)
    if compared is None:
        row["note"] = (row["note"] + "; " if row["note"] else "") + f"no {COMPARED} row in this run: {mark} not checked"
    elif not _finite(compared.get("ips")) or not float(compared["ips"]) > 0:
        _mark(row, False, f"{COMPARED} has no img/s to compare with ({mark})")
    elif _finite(row["ips"]):
        single, ips = float(compared["ips"]), float(row["ips"])
        text = f"{gpus} GPU{'s' if gpus > 1 else ''} {ips:.0f} img/s = {ips / single:.2f}x {COMPARED}'s {single:.0f}"
        _mark(row, ips >= fraction * single * (1 - 1e-9), f"{text} ({mark})")


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group `pgid` still runs (a zombie does not: it holds no GPU, only a table entry)."""
    proc = Path("/proc")
    if proc.is_dir():
        for stat in proc.glob("[0-9]*/stat"):
            try:
                state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            except (OSError, IndexError, ValueError):
                continue  # a process that ended while we looked
            if int(group) == pgid and state not in ("Z", "X"):
                return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(process: subprocess.Popen) -> None:
    """Stop every process of `process`'s group (it leads its own session: DDP ranks it launched, loader workers):
    SIGTERM, then SIGKILL to what is left after KILL_GRACE_S; returns when none runs (or after another grace)."""
    pgid = process.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        process.poll()  # reap the leader if it has exited
        if not _group_alive(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + KILL_GRACE_S
        while time.monotonic() < deadline:
            process.poll()
            if not _group_alive(pgid):
                break
            time.sleep(0.05)
    try:
        process.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass  # unkillable (uninterruptible sleep in a driver): nothing more to do from here


def run_process(command: list[str], output: IO[str], timeout_s: float | None = None) -> int:
    """Run `command` from the checkout in a new session (its own process group), stdout and stderr to `output`;
    its exit status. Past `timeout_s` (or on any exception here, Ctrl-C included: the group no longer gets the
    terminal's SIGINT) the whole group is stopped (stop_group) and the exception (subprocess.TimeoutExpired)
    raised. After it exits, whatever it left in its group (a rank that outlived rank 0) is stopped too."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        returncode = process.wait(timeout=timeout_s)
    except BaseException:
        stop_group(process)
        raise
    stop_group(process)
    return returncode


def _mark_total_vs_compute(row: dict[str, Any], summary: dict[str, Any], fraction: float) -> None:
    total, compute = summary.get("train.total_ips"), summary.get("train.compute_ips")
    if total is None or compute is None or not float(compute) > 0:
        _mark(row, False, f"no train.total_ips and train.compute_ips (mark total >= {fraction:.2f}x compute)")
        return
    ratio = float(total) / float(compute)
    _mark(row, ratio >= fraction, f"total {ratio:.2f}x compute ({float(total):.0f} of {float(compute):.0f} img/s, "
                                  f"mark >= {fraction:.2f}x)")  # fmt: skip


def parse_overhead(text: str) -> dict[str, float]:
    """The figures of `python -m imgcls.bench.overhead`'s table in `text` (its output, other lines around it):
    batch, and per loop the median ms a step (bare_ms, imgcls_ms) and device ms a step (NaN where '-').
    Raises ValueError without a table."""
    header = re.search(r", batch (\d+), precision=", text)
    if header is None:
        raise ValueError("no bench.overhead table in the output")
    figures: dict[str, float] = {"batch": float(header.group(1))}
    columns = re.search(r"^\| loop \|(.*)\|\s*$", text, flags=re.M)
    if columns is None:
        raise ValueError("no header row in bench.overhead's table")
    names = [c.strip() for c in columns.group(1).split("|")]  # by name: the table has gained columns before
    try:
        host_at, device_at = names.index("ms a step, median (min-max)"), names.index("device ms a step")
    except ValueError:
        raise ValueError(f"bench.overhead's table has no median or device column ({names})") from None
    for name, key in ((BARE, "bare"), (IMGCLS, "imgcls")):
        row = re.search(rf"^\| {re.escape(name)} \|(.*)\|\s*$", text, flags=re.M)
        if row is None:
            raise ValueError(f"no '{name}' row in bench.overhead's table")
        cells = [c.strip() for c in row.group(1).split("|")]
        host, device = cells[host_at].split()[0], cells[device_at].split()[0]
        figures[f"{key}_ms"] = float(host)
        figures[f"{key}_device_ms"] = math.nan if device == "-" else float(device)
    return figures


def _bare_loop_row(row: dict[str, Any], output: str, fraction: float, done: dict[str, dict[str, Any]]) -> None:
    """The bare_loop row from bench.overhead's output: the bare loop's img/s, and the mark on the
    resnet50_amp_benchmark row's img/s (this run's, from `done`) against it."""
    try:
        figures = parse_overhead(output)
    except ValueError as error:
        row.update(status="FAILED", note=str(error))
        return
    batch = figures["batch"]
    bare = 1000 * batch / figures["bare_ms"]
    own = 1000 * batch / figures["imgcls_ms"]
    row["ips"] = bare
    compared = done.get(COMPARED)
    if compared is None:
        row["note"] = f"no {COMPARED} row in this run: the {fraction:.2f}x mark not checked"
    elif compared.get("ips") is None:
        _mark(row, False, f"{COMPARED} has no img/s to compare with the bare loop's (mark >= {fraction:.2f}x)")
    else:
        ratio = float(compared["ips"]) / bare
        _mark(row, ratio >= fraction, f"{COMPARED} {float(compared['ips']):.0f} img/s = {ratio:.2f}x the bare loop "
                                      f"(mark >= {fraction:.2f}x)")  # fmt: skip
    row["note"] += f"; cross-check, bench.overhead's own imgcls loop: {own:.0f} img/s ({own / bare:.2f}x the bare loop)"


def _cifar_bare_loop_row(row: dict[str, Any], output: str, mark: float, done: dict[str, dict[str, Any]]) -> None:
    """The cifar_bare_loop row from bench.bare_loop's output: the bare loop's img/s over the epoch, and the mark on
    cifar_end_to_end's epoch (this run's, from `done`): its wall time a sample <= `mark` x the bare loop's. A
    sample, not an epoch: both drop the last partial batch, but a folder whose loaders differ must not pass."""
    try:
        figures = parse_bare_loop(output)
    except ValueError as error:
        row.update(status="FAILED", note=str(error))
        return
    row["ips"] = figures["ips"]
    bare = f"bare loop {figures['samples']:.0f} images in {figures['wall_s']:.1f} s"
    compared = done.get(CIFAR_ROW)
    if compared is None:
        row["note"] = f"{bare}; no {CIFAR_ROW} row in this run: the {mark:.2f}x mark not checked"
    elif not _finite(compared.get("ips")) or not float(compared["ips"]) > 0:
        row["note"] = bare
        _mark(row, False, f"{CIFAR_ROW} has no img/s to compare with the bare loop's (mark <= {mark:.2f}x)")
    else:
        ratio = figures["ips"] / float(compared["ips"])
        row["note"] = bare
        text = f"{CIFAR_ROW}'s epoch {ratio:.2f}x the bare loop's wall time a sample"
        _mark(row, ratio <= mark * (1 + 1e-9), f"{text} ({float(compared['ips']):.0f} img/s, mark <= {mark:.2f}x)")


def parse_bare_loop(text: str) -> dict[str, float]:
    from imgcls.bench.bare_loop import parse_result

    return parse_result(text)


def _mark_validated(row: dict[str, Any], summary: dict[str, Any], keys: tuple[str, ...]) -> None:
    """A training row that must have validated: each key finite in report.json's run summary."""
    missing = [key for key in keys if not _finite(summary.get(key))]
    figures = ", ".join(f"{key} {float(summary[key]):.1f}%" for key in keys if key not in missing)
    _mark(row, not missing, figures or f"no finite {', '.join(missing)} in report.json: it did not validate")


def _mark_versus_published(row: dict[str, Any], hardware: str, mark: tuple[str, str, float]) -> None:
    """The row's img/s >= fraction x NVIDIA's one-GPU training img/s of `model` at `precision` on `hardware`'s
    GPU; without a published figure for the profile the mark is not checked, and the note says so."""
    model, precision, fraction = mark
    published = throughput_table().get((model, hardware, precision), {}).get(1)
    if published is None:
        row["note"] = (row["note"] + "; " if row["note"] else "") + (
            f"NVIDIA published no 1-GPU {model} {precision} img/s for {hardware}: the {fraction:.2f}x mark not checked"
        )
        return
    row["published"] = published
    ips = float(row["ips"]) if _finite(row.get("ips")) else 0.0
    _mark(row, ips >= fraction * published * (1 - 1e-9), f"{ips / published:.2f}x NVIDIA's {model} {precision} "
                                                          f"{published} img/s (mark >= {fraction:.2f}x)")  # fmt: skip


def execute(
    check: Check,
    hardware: str,
    gpus: int,
    timeout_s: float | None = None,
    gpu_name: str = "",
    done: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run one check and make its table row. `done`: the rows already run, by path (the bare_loop and ddp_nccl
    rows compare with the resnet50_amp_benchmark row)."""
    row: dict[str, Any] = {"path": check.path, "status": "ok", "ips": None, "published": None, "syncs": None,
                           "note": ""}  # fmt: skip
    if gpus < check.needs_gpus:
        row.update(status="skipped", note=f"needs {check.needs_gpus} GPUs, {gpus} visible")
        return row
    if check.path.startswith("dali") and importlib.util.find_spec("nvidia.dali") is None:
        row.update(status="skipped", note="nvidia.dali is not installed in this environment")
        return row
    if check.program != ("train.py",):
        command = [sys.executable, *check.program, *check.overrides]
    else:
        command = [sys.executable, str(ROOT / check.program[0]), *check.program[1:], *check.overrides]
    run_dir = check.directory()
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "gpu_check.log"  # the whole output stays for a failed row; the table shows its last line
    with log.open("w") as output:
        try:
            returncode = run_process(command, output, timeout_s)
        except subprocess.TimeoutExpired:
            row.update(status="FAILED", note=f"no result in {timeout_s:.0f} s, its process group stopped (log: {log})")
            return row
    if returncode != 0:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        row.update(status="FAILED", note=f"exit {returncode}: {(lines or ['no output'])[-1].strip()}")
        return row
    if "versus_bare_loop" in check.extra:
        _bare_loop_row(row, log.read_text(errors="replace"), check.extra["versus_bare_loop"], done or {})
        return row
    if "versus_cifar_epoch" in check.extra:
        _cifar_bare_loop_row(row, log.read_text(errors="replace"), check.extra["versus_cifar_epoch"], done or {})
        return row
    if check.program == PYTEST:
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        row["note"] = f"pytest -m gpu tests/test_dali_device_copies.py: {(lines or ['no output'])[-1].strip(' =')}"
        return row
    summary = _result(run_dir)
    ips = summary.get("train.total_ips")
    row["ips"] = ips
    if ips is None or not math.isfinite(float(ips)) or float(ips) <= 0:
        row.update(status="FAILED", note="no train.total_ips in the run's output")
    if check.path == "amp+GradScaler":
        _mark_trained(row, summary)
    if "train.host_syncs_per_step" in summary:
        row["syncs"] = summary["train.host_syncs_per_step"]
    if "val.host_syncs_per_step" in summary:
        row["val_syncs"] = summary["val.host_syncs_per_step"]
    if "tf32" in check.extra and summary.get("cuda.tf32") != check.extra["tf32"]:
        row.update(status="FAILED", note=f"TF32 in the training process was {summary.get('cuda.tf32')}, "
                                         f"expected {check.extra['tf32']}")  # fmt: skip
        _mark_syncs(row)
        return row
    if check.extra.get("assert") == "tf32_changes_results":
        difference = tf32_changes_results()
        ampere = torch.cuda.get_device_capability()[0] >= 8
        row["note"] = f"max |TF32 - FP32| of a conv: {difference:.2e}"
        if ampere and difference == 0:
            row.update(status="FAILED", note="precision=tf32 gives the same conv result as fp32 on an Ampere+ GPU")
    if check.published:
        precision, count = check.published
        numbers = throughput_table().get(("resnet50", hardware, precision), {})
        if count in numbers:
            row["published"] = numbers[count]
            fraction, basis = pass_mark(gpu_name, hardware)
            note = f"NVIDIA {SOURCES[hardware]}"
            if check.path == "resnet50_amp_benchmark" and row["status"] == "ok" and ips is not None:
                ratio = float(ips) / row["published"]
                note += f"; {ratio:.2f}x of it, pass mark {fraction:.2f}x ({basis})"
                if ratio < fraction:
                    row["status"] = "FAILED"
            row["note"] = (row["note"] + "; " if row["note"] else "") + note
    if "versus_single_gpu" in check.extra:
        _mark_versus_single_gpu(row, gpus, check.extra["versus_single_gpu"], done or {})
    if "total_vs_compute" in check.extra:
        _mark_total_vs_compute(row, summary, check.extra["total_vs_compute"])
    if "validated" in check.extra:
        _mark_validated(row, summary, check.extra["validated"])
    if "versus_published" in check.extra:
        _mark_versus_published(row, hardware, check.extra["versus_published"])
    if check.path == CIFAR_ROW:
        top1 = summary.get("val.top1")
        row["note"] += "; val.top1 " + (f"{float(top1):.1f}%" if top1 is not None else "missing")
        row["note"] += f" (the first {VAL_BATCHES} val batches, in class order: a smoke figure)"
    _mark_syncs(row)
    return row


def pass_mark(gpu_name: str, hardware: str) -> tuple[float, str]:
    """The fraction of NVIDIA's published img/s the resnet50 AMP benchmark must reach, and why. On the GPU
    NVIDIA measured, 0.9 (their numbers come from a tuned container and full DALI pipelines); on a newer GPU
    that NVIDIA published no ResNet50 number for (H100, H200, B200: compared with the A100 80GB row), at
    least the older GPU's number."""
    name = gpu_name.upper()
    measured = {"dgxa100": "A100", "dgx1v": "V100", "dgx1v_32g": "V100"}.get(hardware)
    if measured and measured in name:
        return 0.9, "same GPU as NVIDIA's row"
    return 1.0, f"{gpu_name} is not the GPU of NVIDIA's row; a newer GPU must at least match it"


def table(rows: list[dict[str, Any]], gpu: str, gpus: int) -> str:
    lines = [
        f"GPU acceptance on {gpus}x {gpu}",
        "| path | status | img/s (imgcls) | img/s (NVIDIA published) | host syncs per step | note |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        ips = f"{float(r['ips']):.0f}" if r["ips"] is not None else "-"
        syncs = f"{float(r['syncs']):.2f}" if r.get("syncs") is not None else "-"
        if r.get("val_syncs") is not None:
            syncs += f" (val {float(r['val_syncs']):.2f})"
        lines.append(f"| {r['path']} | {r['status']} | {ips} | {r['published'] or '-'} | {syncs} | {r['note']} |")
    return "\n".join(lines)


def budget_s(planned: list[Check]) -> float:
    """The estimated seconds of the rows `planned` on one H200 (ESTIMATE_S), start-ups included."""
    return float(sum(ESTIMATE_S[check.path] for check in planned))


def default_data_root() -> str:
    cache = Path(os.environ.get("IMGCLS_CACHE", Path.home() / ".cache" / "imgcls"))
    return str(cache / "cifar10")  # train/ and val/ of the shared CIFAR-10 JPEGs (`make gpu-check` extracts it)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m imgcls.bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed iterations / training steps per path")
    parser.add_argument("--data", default=default_data_root(), help="ROOT with train/ and val/ class folders")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one check may take before it fails")
    parser.add_argument("--only", default=None, help="comma-separated paths to run, e.g. amp+GradScaler,compile")
    parser.add_argument("--dry-run", action="store_true", help="print the train.py commands, run nothing")
    parser.add_argument("--gpus", type=int, default=None, help="with --dry-run: the commands for this many GPUs")
    parser.add_argument("--hardware", default=None, help="with --dry-run: the hardware profile of the commands")
    args = parser.parse_args(argv)
    if args.dry_run:
        run_root = "/tmp/imgcls-gpu-check"  # only printed
        gpus = args.gpus or max(torch.cuda.device_count(), 1)
        hardware = args.hardware or "dgxa100"
        if args.hardware is None and torch.cuda.is_available():
            properties = torch.cuda.get_device_properties(0)
            hardware = hardware_for(properties.name, properties.total_memory / 2**30)
        planned = checks(hardware, gpus, args.data, args.steps, run_root)
        for check in planned:
            print(f"{check.path}: {check.command()}")
        print(f"gpu_check: {len(planned)} rows, about {budget_s(planned) / 60:.1f} min on one H200 (an estimate, not a "
              f"measurement; budget {TOTAL_BUDGET_S / 60:.0f} min)", file=sys.stderr)  # fmt: skip
        return 0
    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA GPU on this machine; nothing to check (python -m imgcls.bench.gpu_check --dry-run "
            "lists the checks)"
        )
        return 0
    gpus = torch.cuda.device_count()
    properties = torch.cuda.get_device_properties(0)
    hardware = args.hardware or hardware_for(properties.name, properties.total_memory / 2**30)
    if not (Path(args.data) / "train").is_dir() or not (Path(args.data) / "val").is_dir():
        print(f"gpu_check: --data {args.data} needs train/ and val/ folders of class folders of JPEGs")
        return 2
    run_root = tempfile.mkdtemp(prefix="imgcls-gpu-check-")  # after the checks above: no empty folder left behind
    rows: list[dict[str, Any]] = []
    for check in checks(hardware, gpus, args.data, args.steps, run_root):
        if args.only and check.path not in args.only.split(","):
            continue
        rows.append(execute(check, hardware, gpus, args.timeout, properties.name, {r["path"]: r for r in rows}))
        row = rows[-1]  # the numbers too: a run cut short by its caller's time limit keeps what it measured
        print(f"gpu_check: {check.path}: {row['status']} img/s {row['ips']} host syncs/iteration {row.get('syncs')} "
              f"{row['note']}", file=sys.stderr, flush=True)  # fmt: skip
    print(table(rows, properties.name, gpus))
    print(f"run dirs under {run_root}")
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
