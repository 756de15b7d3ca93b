"""`python -m imgcls.bench.overhead [OVERRIDES...]`: the host time a training step costs in imgcls's loop against a
bare PyTorch loop, over the same network and the same batch on the device.

The bare loop is what a user would write: forward, loss, backward, optimizer step, scheduler step, with autocast
and a GradScaler under precision=amp, and no host sync. The smallest LightningModule (training_step, the same
optimizer and schedule) under a bare Trainer shows what Lightning's own loop costs. imgcls's loop is
`mode=benchmark` (the real Trainer, module, callbacks and data module; data=synthetic: one batch on the device).
Each loop runs `--repeats` times, alternating, and the table shows the median ms a step and the spread. On a GPU
the timing waits for the device at the ends only, so a loop whose host work per step exceeds the device's shows
it; the device ms a step come from CUDA events.

The default network is timm's `test_resnet` at 8 px, batch 8, fp32 on the CPU: its compute is a few ms, so the
host work of the loop around it shows. `--profile N` prints imgcls's N costliest functions (cProfile, own time).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import math
import pstats
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch
from omegaconf import DictConfig, open_dict

DEFAULTS = (
    "mode=benchmark", "data=synthetic", "hardware=cpu", "precision=fp32", "model=resnet18", "model.arch=test_resnet",
    "model.image_size=8", "data.batch_size=8", "recipe.global_batch_size=8", "data.num_classes=10",
    "logger=none", "callbacks.progress_bar=none", "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
)  # fmt: skip


def compose(overrides: list[str], steps: int, warmup: int, run_dir: str) -> DictConfig:
    from imgcls.config.compose import compose_config

    cfg = compose_config("train", [*DEFAULTS, f"benchmark.iterations={steps}", f"benchmark.warmup={warmup}",
                                   *overrides])  # fmt: skip
    with open_dict(cfg):
        cfg.run_dir = run_dir
    return cfg


def imgcls_loop(cfg: DictConfig) -> dict[str, float]:
    """ms a step of imgcls's mode=benchmark (its own timer: from the end of the warm-up to the device's end)."""
    from imgcls.bench.training import run

    with contextlib.redirect_stdout(io.StringIO()):  # its JSON document; the table below has the numbers
        metrics = run(cfg)
    batch = _batch_size(cfg)
    return {
        "host_ms": 1000 * batch / metrics["train.total_ips"],
        "device_ms": 1000 * batch / metrics["train.compute_ips"],
    }


def _batch_size(cfg: DictConfig) -> int:
    from imgcls.run.plan import resolve_plan

    return resolve_plan(cfg).per_device_batch


@dataclass
class _Parts:
    """What both hand-made loops train: imgcls's network, optimizer and schedule, on the same batch and device."""

    device: torch.device
    net: torch.nn.Module
    images: torch.Tensor
    labels: torch.Tensor
    optimizer: torch.optim.Optimizer
    scheduler: Any
    half: torch.dtype | None


def _parts(cfg: DictConfig, total_steps: int) -> _Parts:
    from imgcls.data.datamodule import ClassificationDataModule
    from imgcls.data.protocol import LoaderSpec
    from imgcls.run.plan import resolve_plan
    from imgcls.training.module import ClassificationModule
    from imgcls.training.optimizer import build_optimizer, parameter_groups
    from imgcls.training.precision import set_tf32
    from imgcls.training.scheduler import build_scheduler
    from imgcls.typed_config import to_dict

    plan = resolve_plan(cfg)
    resolved = to_dict(cfg, resolve=True)
    device = torch.device("cuda" if str(cfg.trainer.accelerator) in ("gpu", "cuda") else "cpu")
    # The backend settings imgcls's Trainer makes (imgcls.run.trainer, imgcls.training.precision), whichever loop
    # runs first.
    torch.backends.cudnn.benchmark = not bool(cfg.deterministic)
    set_tf32(bool(cfg.precision.get("tf32")))
    datamodule = ClassificationDataModule(cfg.data, batch_size=plan.per_device_batch, seed=int(cfg.seed))
    module = ClassificationModule(resolved["model"], resolved["recipe"], plan.as_dict(), datamodule.classes)
    net = module.net.to(device)
    if cfg.get("compile"):
        net.compile()
    images, labels = datamodule.backend.loader(LoaderSpec("train", plan.per_device_batch, device=device)).batch()
    optimizer = build_optimizer(parameter_groups(net, plan.weight_decay), module.recipe, plan.lr)
    scheduler = build_scheduler(optimizer, total_steps=total_steps, warmup_steps=0, end_lr=0.0)
    half = {"amp": torch.float16, "bf16": torch.bfloat16}.get(str(cfg.precision.name))
    if half is torch.float16 and device.type == "cpu" and not cfg.precision.get("cpu_fp16"):
        half = torch.bfloat16  # what imgcls runs for precision=amp on a CPU (imgcls.training.precision)
    return _Parts(device, net, images, labels, optimizer, scheduler, half)


class _Clock:
    """Wall time from the end of the warm-up to the device's end of the last step; CUDA events for device time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.started = 0.0
        self.result: dict[str, float] = {}
        self._start: Any = None

    def start(self) -> None:
        _wait(self.device)
        self.started = time.perf_counter()
        if self.device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()

    def stop(self, steps: int) -> dict[str, float]:
        end = None
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        _wait(self.device)
        host_ms = 1000 * (time.perf_counter() - self.started) / steps
        device_ms = self._start.elapsed_time(end) / steps if end is not None else math.nan
        self.result = {"host_ms": host_ms, "device_ms": device_ms}
        return self.result


def bare_loop(cfg: DictConfig, steps: int, warmup: int) -> dict[str, float]:
    """The same network, optimizer and schedule as imgcls builds them, in a plain loop over the same batch."""
    parts = _parts(cfg, steps + warmup)
    net, optimizer, device, half = parts.net, parts.optimizer, parts.device, parts.half
    scaler = torch.amp.GradScaler(device.type, enabled=half is torch.float16)
    criterion = torch.nn.CrossEntropyLoss()
    clock = _Clock(device)
    for step in range(steps + warmup):
        if step == warmup:
            clock.start()
        with torch.autocast(device.type, dtype=half or torch.float32, enabled=half is not None):
            loss = criterion(net(parts.images), parts.labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        parts.scheduler.step_update(num_updates=step + 1)
    return clock.stop(steps)


def lightning_loop(cfg: DictConfig, steps: int, warmup: int) -> dict[str, float]:
    """The same parts in the smallest LightningModule (training_step, optimizer, scheduler) and a bare Trainer: what
    Lightning's own loop costs, apart from what imgcls adds to it."""
    import lightning as L

    parts = _parts(cfg, steps + warmup)
    clock = _Clock(parts.device)
    by_dtype: dict[torch.dtype | None, Literal["16-mixed", "bf16-mixed", "32-true"]] = {
        torch.float16: "16-mixed",
        torch.bfloat16: "bf16-mixed",
        None: "32-true",
    }
    precision = by_dtype[parts.half]

    class Minimal(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = parts.net

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return {"optimizer": parts.optimizer, "lr_scheduler": {"scheduler": parts.scheduler, "interval": "step"}}

        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            scheduler.step_update(num_updates=self.global_step)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == warmup - 1:
                clock.start()
            if batch_idx == warmup + steps - 1:
                clock.stop(steps)

    class SameBatch:  # an iterable of the one batch (a list would be several loaders to Lightning)
        def __len__(self) -> int:
            return steps + warmup

        def __iter__(self) -> Any:
            return iter([(parts.images, parts.labels)] * (steps + warmup))

    trainer = L.Trainer(
        accelerator=parts.device.type, devices=1, precision=precision, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        benchmark=not bool(cfg.deterministic),
    )  # fmt: skip
    trainer.fit(Minimal(), SameBatch())
    return clock.result


def _wait(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile(cfg: DictConfig, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    imgcls_loop(cfg)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def table(results: dict[str, list[dict[str, float]]], cfg: DictConfig, steps: int) -> str:
    def cell(rows: list[dict[str, float]], key: str) -> str:
        values = [r[key] for r in rows if not math.isnan(r[key])]
        if not values:
            return "-"
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    bare = statistics.median(r["host_ms"] for r in results["bare PyTorch loop"])
    lines = [
        f"{cfg.model.arch} @{cfg.model.image_size} px, batch {_batch_size(cfg)}, precision={cfg.precision.name}, "
        f"{cfg.trainer.accelerator}, {steps} timed steps x {len(results['bare PyTorch loop'])} runs",
        "| loop | ms a step, median (min-max) | device ms a step | extra host ms over the bare loop |",
        "|---|---:|---:|---:|",
    ]
    for name, rows in results.items():
        extra = statistics.median(r["host_ms"] for r in rows) - bare
        lines.append(f"| {name} | {cell(rows, 'host_ms')} | {cell(rows, 'device_ms')} | {extra:+.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m imgcls.bench.overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="timed steps a run")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each loop, alternating")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print imgcls's N costliest functions")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: host time, not core contention)")
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. precision=amp model=resnet50")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="imgcls-overhead-") as run_dir:
        cfg = compose(args.overrides, args.steps, args.warmup, run_dir)
        from imgcls.config.hardware import resolve_auto_hardware

        resolve_auto_hardware(cfg)
        results: dict[str, list[dict[str, float]]] = {
            "bare PyTorch loop": [], "Lightning, smallest module": [], "imgcls (mode=benchmark)": [],
        }  # fmt: skip
        for _ in range(args.repeats):
            results["bare PyTorch loop"].append(bare_loop(cfg, args.steps, args.warmup))
            results["Lightning, smallest module"].append(lightning_loop(cfg, args.steps, args.warmup))
            results["imgcls (mode=benchmark)"].append(imgcls_loop(cfg))
        print(table(results, cfg, args.steps))
        if args.profile:
            print(profile(cfg, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
