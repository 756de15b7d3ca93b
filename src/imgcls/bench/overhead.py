"""`python -m imgcls.bench.overhead [OVERRIDES...]`: the host time a training step costs in imgcls's loop against a
bare PyTorch loop, over the same network and the same batch on the device.

The bare loop is what a user would write: forward, loss, backward, optimizer step, scheduler step, with autocast
and a GradScaler under precision=amp, and no host sync. The smallest LightningModule (training_step, the same
optimizer and schedule) under a bare Trainer shows what Lightning's own loop costs. imgcls's loop is
`mode=benchmark` (the real Trainer, module, callbacks and data module; data=synthetic: one batch on the device).
Each loop runs `--repeats` times, alternating, and the table shows the median ms a step and the spread. The extra
over the bare loop is measured inside each run of Lightning's and imgcls's loops, which run the bare loop `--chunk`
steps at a time between their own (BareChunks; the timing waits for the device at each chunk's ends). `--chunk 0`
pairs each run with the bare loop's run just before it instead; on a GPU the timing then waits for the device at the
run's ends only, so a loop whose host work per step exceeds the device's shows it; the device ms a step come from
CUDA events. Each loop then runs once more with its Python calls counted (`--no-calls`: not): a count of the host
work that the machine's speed does not move.

The default network is timm's `test_resnet` at 8 px, batch 8, fp32 on the CPU: its compute is a few ms, so the
host work of the loop around it shows. `--sets` picks published recipes' feature sets instead (FEATURE_SETS): the
TF2 EfficientNet AMP one (TF's RMSprop, fp16 loss scaling, EMA, drop path) and the TF1 250-epoch one (per-sample
mixup, SGD, fp16), each on a test network at 8 px. Their bare loops use what a user would write: timm's RMSpropTF
(or torch's fused SGD), torch.amp.GradScaler (which reads the overflow flag on the host), timm's ModelEmaV3, and a
per-sample mixup of a few tensor ops. Where imgcls's optimizer is not the bare loop's (RMSprop under a loss scaler
skips overflowed steps on the device: training/rmsprop.py), a fourth row runs the bare loop with imgcls's
optimizer, stepped as imgcls's precision plugin steps it: the difference is what the skip itself costs. `--profile
N` prints imgcls's N costliest functions (cProfile, own time).
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from unittest import mock

import torch
from omegaconf import DictConfig, open_dict

DEFAULTS = (
    "mode=benchmark", "data=synthetic", "hardware=cpu", "precision=fp32", "model=resnet18", "model.arch=test_resnet",
    "model.image_size=8", "data.batch_size=8", "recipe.global_batch_size=8", "data.num_classes=10",
    "logger=none", "callbacks.progress_bar=none", "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
)  # fmt: skip


# The published recipes' features on the CPU, each over a test network at 8 px, batch 8, real fp16 autocast and loss
# scaling (precision.cpu_fp16). efficientnet_amp: TF2's EfficientNet-B0 AMP runs (experiment/tf2_efficientnet_b0_*_amp:
# RMSpropTF, Keras' dynamic loss scale, EMA 0.9999 with its ramp, per-sample drop path 0.2). tf1_250e: TF1's 250-epoch
# ResNet AMP runs (experiment/tf1_resnet50_*_amp_250e: per-sample mixup 0.2, label smoothing, SGD with momentum,
# the static loss scale 128).
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "plain": (),
    "efficientnet_amp": (
        "recipe=tf2_efficientnet", "model=efficientnet_b0", "model.arch=test_efficientnet", "model.image_size=8",
        "model.drop_path_rate=0.2", "model.drop_path_mask=sample", "precision=amp", "precision.cpu_fp16=true",
        "precision.loss_scale.init_scale=32768", "precision.loss_scale.growth_interval=2000",
        "recipe.global_batch_size=8",
    ),
    "tf1_250e": (
        "recipe=tf1_250e", "precision=amp", "precision.cpu_fp16=true", "precision.loss_scale.dynamic=false",
        "recipe.global_batch_size=8",
    ),
}  # fmt: skip


def compose(overrides: list[str], steps: int, warmup: int, run_dir: str, feature_set: str = "plain") -> DictConfig:
    from imgcls.config.compose import compose_config

    chosen = [*DEFAULTS, *FEATURE_SETS[feature_set], f"benchmark.iterations={steps}", f"benchmark.warmup={warmup}",
              *overrides]  # fmt: skip
    by_key = {override.split("=", 1)[0]: override for override in chosen}  # a later value of a key wins
    cfg = compose_config("train", list(by_key.values()))
    with open_dict(cfg):
        cfg.run_dir = run_dir
    return cfg


def imgcls_loop(cfg: DictConfig, count_calls: bool = False, chunks: BareChunks | None = None) -> dict[str, float]:
    """ms a step of imgcls's mode=benchmark (its own timer: from the end of the warm-up to the device's end), and the
    process's CPU time over the same window (read where its timer starts and stops). count_calls: the Python calls
    a step over that window instead (CallCounter: the counting slows the loop, so its times mean nothing). chunks:
    the bare loop interleaved (BareChunks), the figures those of imgcls's own chunks."""
    from imgcls.bench import training

    cpu: dict[str, float] = {}
    calls = CallCounter()
    timer_end = training.BenchmarkTimer.on_train_batch_end

    def on_train_batch_end(self: training.BenchmarkTimer, *args: Any, **kwargs: Any) -> None:
        timer_end(self, *args, **kwargs)
        if chunks is not None and self.seen >= self.warmup:
            chunks.after_step(self.seen - self.warmup)
        if self.seen == self.warmup:
            cpu["start"] = time.process_time()
            if count_calls:
                calls.start()
        if self.seen == self.warmup + self.iterations:
            calls.stop()
            cpu["stop"] = time.process_time()

    with (
        contextlib.redirect_stdout(io.StringIO()),  # its JSON document; the table below has the numbers
        mock.patch.object(training.BenchmarkTimer, "on_train_batch_end", on_train_batch_end),
    ):
        metrics = training.run(cfg)
    batch = _batch_size(cfg)
    steps = int(cfg.benchmark.iterations)
    return {
        "host_ms": 1000 * batch / metrics["train.total_ips"],
        "cpu_ms": 1000 * (cpu["stop"] - cpu["start"]) / steps,
        "device_ms": 1000 * batch / metrics["train.compute_ips"],
        "calls": calls.count / steps if count_calls else math.nan,
    } | (chunks.figures() if chunks is not None else {})


class CallCounter:
    """Function calls (Python functions and the C functions they call) on this thread between start() and stop(),
    as cProfile counts them: a count of the host work a loop does that the machine's speed does not move, where its
    wall time here varies 2-3x by the minute. The network's own calls are in every loop alike."""

    def __init__(self) -> None:
        self.count = 0
        self._profiler: cProfile.Profile | None = None

    def start(self) -> None:
        self._profiler = cProfile.Profile()
        self._profiler.enable()

    def stop(self) -> None:
        if self._profiler is not None:
            self._profiler.disable()
            self.count = sum(entry.callcount for entry in self._profiler.getstats())
            self._profiler = None


def _batch_size(cfg: DictConfig) -> int:
    from imgcls.run.plan import resolve_plan

    return resolve_plan(cfg).per_device_batch


@dataclass
class _Parts:
    """What the hand-made loops train: imgcls's network (drop path included), parameter groups, schedule and batch on
    the same device, with the optimizer, loss scaler, EMA and mixup a user would write around them."""

    device: torch.device
    net: torch.nn.Module
    images: torch.Tensor
    labels: torch.Tensor
    optimizer: torch.optim.Optimizer
    scheduler: Any
    half: torch.dtype | None
    scaler: torch.amp.GradScaler
    ema: Any
    mixup: float
    smoothing: float
    num_classes: int


def _parts(cfg: DictConfig, total_steps: int, imgcls_optimizer: bool = False) -> _Parts:
    """imgcls_optimizer: the optimizer imgcls trains with (build_optimizer: RMSprop that skips overflowed steps on
    the device) instead of the user's (timm's RMSpropTF as it is; SGD is torch's fused one either way)."""
    from timm.utils import ModelEmaV3

    from imgcls.data.datamodule import ClassificationDataModule
    from imgcls.data.protocol import LoaderSpec
    from imgcls.data.synthetic import SyntheticBatches
    from imgcls.run.plan import resolve_plan
    from imgcls.training.module import ClassificationModule
    from imgcls.training.optimizer import build_optimizer, parameter_groups
    from imgcls.training.precision import NVIDIA_DEFAULT_SCALE, set_tf32
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
    loader = datamodule.backend.loader(LoaderSpec("train", plan.per_device_batch, device=device))
    if not isinstance(loader, SyntheticBatches):  # DEFAULTS' data=synthetic: the one batch made on the device
        raise TypeError(f"bench.overhead times data=synthetic's batch, not a {type(loader).__name__}'s")
    images, labels = loader.batch()
    recipe = module.recipe
    fused = imgcls_optimizer or recipe.optimizer == "sgd"
    groups = parameter_groups(net, plan.weight_decay, str(recipe.weight_decay_on))
    optimizer = build_optimizer(groups, recipe, plan.lr, fused=fused)
    scheduler = build_scheduler(optimizer, total_steps=total_steps, warmup_steps=0, end_lr=0.0, schedule="cosine")
    half = {"amp": torch.float16, "bf16": torch.bfloat16}.get(str(cfg.precision.name))
    if half is torch.float16 and device.type == "cpu" and not cfg.precision.get("cpu_fp16"):
        half = torch.bfloat16  # what imgcls runs for precision=amp on a CPU (imgcls.training.precision)
    scale = cfg.precision.get("loss_scale") or NVIDIA_DEFAULT_SCALE  # what imgcls runs for a null loss_scale
    scaler = torch.amp.GradScaler(
        device.type,
        init_scale=float(scale["init_scale"]),
        growth_interval=int(scale["growth_interval"]),
        enabled=half is torch.float16,
    )
    ema = None
    if recipe.ema_decay:
        # timm's EMA as a user runs it (its decay, ramped or not, costs the same: one float a step)
        ema = ModelEmaV3(net, decay=float(recipe.ema_decay))
    mixup = float(recipe.mixup or 0.0) if recipe.mixup_mode == "elem" else 0.0
    return _Parts(device, net, images, labels, optimizer, scheduler, half, scaler, ema, mixup,
                  float(recipe.label_smoothing), len(datamodule.classes))  # fmt: skip


def _training_batch(parts: _Parts) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and targets of a step: per-sample mixup with the reversed batch (TF1's and timm's elem mode) in a few
    tensor ops, as a user writes it, and label smoothing; or the labels themselves."""
    if not parts.mixup:
        return parts.images, parts.labels
    n = parts.images.shape[0]
    lam = torch.distributions.Beta(parts.mixup, parts.mixup).sample((n,)).to(parts.device)
    images = parts.images * lam.view(n, 1, 1, 1) + parts.images.flip(0) * (1 - lam).view(n, 1, 1, 1)
    off, on = parts.smoothing / parts.num_classes, 1 - parts.smoothing + parts.smoothing / parts.num_classes
    one_hot = torch.full((n, parts.num_classes), off, device=parts.device).scatter_(1, parts.labels.view(n, 1), on)
    return images, one_hot * lam.view(n, 1) + one_hot.flip(0) * (1 - lam).view(n, 1)


class _Clock:
    """Wall time from the end of the warm-up to the device's end of the last step, the process's CPU time over the
    same steps, and CUDA events for device time."""

    def __init__(self, device: torch.device, count_calls: bool = False) -> None:
        self.device = device
        self.calls = CallCounter() if count_calls else None
        self.started = 0.0
        self.cpu_started = 0.0
        self.result: dict[str, float] = {}
        self._start: Any = None

    def start(self) -> None:
        _wait(self.device)
        self.started = time.perf_counter()
        self.cpu_started = time.process_time()
        if self.device.type == "cuda":
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        if self.calls is not None:
            self.calls.start()

    def stop(self, steps: int) -> dict[str, float]:
        if self.calls is not None:
            self.calls.stop()
        end = None
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        _wait(self.device)
        host_ms = 1000 * (time.perf_counter() - self.started) / steps
        cpu_ms = 1000 * (time.process_time() - self.cpu_started) / steps
        device_ms = self._start.elapsed_time(end) / steps if end is not None else math.nan
        calls = self.calls.count / steps if self.calls is not None else math.nan
        self.result = {"host_ms": host_ms, "cpu_ms": cpu_ms, "device_ms": device_ms, "calls": calls}
        return self.result


def _bare_step(parts: _Parts, imgcls_optimizer: bool = False) -> Callable[[int], None]:
    """One step of the bare loop over `parts`, given the step's index (the EMA's ramp, the schedule).
    imgcls_optimizer: the gradients are unscaled before the optimizer's step, as imgcls's precision plugin does."""
    net, optimizer, device, half, scaler = parts.net, parts.optimizer, parts.device, parts.half, parts.scaler
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.0 if parts.mixup else parts.smoothing)
    unscale_first = imgcls_optimizer and scaler.is_enabled() and getattr(optimizer, "_step_supports_amp_scaling", False)

    def step(index: int) -> None:
        images, targets = _training_batch(parts)
        with torch.autocast(device.type, dtype=half or torch.float32, enabled=half is not None):
            loss = criterion(net(images), targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if unscale_first:
            scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        if parts.ema is not None:
            parts.ema.update(net, step=index)
        parts.scheduler.step_update(num_updates=index + 1)

    return step


def bare_loop(
    cfg: DictConfig, steps: int, warmup: int, imgcls_optimizer: bool = False, count_calls: bool = False
) -> dict[str, float]:
    """The same network and schedule as imgcls builds them, in a plain loop over the same batch. imgcls_optimizer:
    with imgcls's optimizer, stepped as imgcls's precision plugin steps it."""
    parts = _parts(cfg, steps + warmup, imgcls_optimizer)
    step = _bare_step(parts, imgcls_optimizer)
    clock = _Clock(parts.device, count_calls)
    for index in range(steps + warmup):
        if index == warmup:
            clock.start()
        step(index)
    return clock.stop(steps)


class BareChunks:
    """The bare loop interleaved with another loop in its own process: after every `size` timed steps of that loop
    (and once before the first), `size` steps of the bare loop on a copy of its parts. Each chunk of the other loop
    is then compared with the bare chunks just before and just after it, a fraction of a second apart: a shared
    machine's speed, which drifts from one minute to the next (docs/benchmarks.md), reaches both sides alike."""

    def __init__(self, cfg: DictConfig, size: int, steps: int, warmup: int) -> None:
        self.size = size
        self.parts = _parts(cfg, warmup + steps + size)
        self._step = _bare_step(self.parts)
        self._index = 0
        self.own: list[tuple[float, float]] = []  # (wall, CPU) seconds of each chunk of the other loop
        self.bare: list[tuple[float, float]] = []
        self._mark: tuple[float, float] | None = None
        for _ in range(warmup):  # warmed up as the other loop is
            self._bare_steps(1)

    def _bare_steps(self, count: int) -> None:
        for _ in range(count):
            self._step(self._index)
            self._index += 1

    def after_step(self, timed: int) -> None:
        """At the end of the other loop's step, `timed` of its timed steps done (0: the end of its warm-up)."""
        if timed % self.size:
            return
        _wait(self.parts.device)
        now = (time.perf_counter(), time.process_time())
        if self._mark is not None:
            self.own.append((now[0] - self._mark[0], now[1] - self._mark[1]))
        self._bare_steps(self.size)
        _wait(self.parts.device)
        after = (time.perf_counter(), time.process_time())
        self.bare.append((after[0] - now[0], after[1] - now[1]))
        self._mark = (time.perf_counter(), time.process_time())

    def figures(self) -> dict[str, float]:
        """The other loop's ms a step over its chunks (wall and CPU), and its extra ms a step over the bare loop: the
        median over its chunks of chunk_extra (paired_host_ms, paired_cpu_ms)."""
        figures = {"chunks": float(len(self.own))}
        for at, key in ((0, "host_ms"), (1, "cpu_ms")):
            own, bare = [c[at] / self.size * 1000 for c in self.own], [c[at] / self.size * 1000 for c in self.bare]
            figures[key] = statistics.fmean(own) if own else math.nan
            figures[f"paired_{key}"] = chunk_extra(own, bare) if own else math.nan
        return figures


def chunk_extra(own: list[float], bare: list[float]) -> float:
    """The median over the other loop's chunks of each one less the mean of the bare chunks either side of it (bare
    has one more: before the first and after each): a drift between the two bare chunks cancels to first order."""
    return statistics.median(o - (before + after) / 2 for o, before, after in zip(own, bare, bare[1:], strict=False))


def lightning_loop(
    cfg: DictConfig, steps: int, warmup: int, count_calls: bool = False, chunks: BareChunks | None = None
) -> dict[str, float]:
    """The same parts in the smallest LightningModule (training_step, optimizer, scheduler, the EMA update after each
    step) and a bare Trainer with Lightning's own precision plugin: what Lightning's own loop costs, apart from what
    imgcls adds to it. chunks: as imgcls_loop's."""
    import lightning as L
    from lightning.pytorch.plugins.precision import MixedPrecision

    parts = _parts(cfg, steps + warmup)
    clock = _Clock(parts.device, count_calls)
    by_dtype: dict[torch.dtype | None, Literal["16-mixed", "bf16-mixed", "32-true"]] = {
        torch.float16: "16-mixed",
        torch.bfloat16: "bf16-mixed",
        None: "32-true",
    }
    precision = by_dtype[parts.half]
    # Lightning turns precision="16-mixed" on a CPU into bf16: real fp16 there needs its plugin, given the scaler.
    scaling = parts.scaler.is_enabled()
    plugins: list[Any] = [MixedPrecision("16-mixed", parts.device.type, parts.scaler)] if scaling else []
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.0 if parts.mixup else parts.smoothing)

    class Minimal(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = parts.net

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            images, targets = _training_batch(parts)
            return criterion(self.net(images), targets)

        def configure_optimizers(self) -> Any:
            return {"optimizer": parts.optimizer, "lr_scheduler": {"scheduler": parts.scheduler, "interval": "step"}}

        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            scheduler.step_update(num_updates=self.global_step)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            if parts.ema is not None:
                parts.ema.update(self.net, step=batch_idx)
            if batch_idx == warmup - 1:
                clock.start()
            if batch_idx == warmup + steps - 1:
                clock.stop(steps)
            if chunks is not None and batch_idx >= warmup - 1:
                chunks.after_step(batch_idx - warmup + 1)

    class SameBatch:  # an iterable of the one batch (a list would be several loaders to Lightning)
        def __len__(self) -> int:
            return steps + warmup

        def __iter__(self) -> Any:
            return iter([(parts.images, parts.labels)] * (steps + warmup))

    trainer = L.Trainer(
        accelerator=parts.device.type, devices=1, precision=None if plugins else precision, plugins=plugins,
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, benchmark=not bool(cfg.deterministic),
    )  # fmt: skip
    trainer.fit(Minimal(), SameBatch())
    return clock.result | (chunks.figures() if chunks is not None else {})


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


BARE, LIGHTNING, IMGCLS = "bare PyTorch loop", "Lightning, smallest module", "imgcls (mode=benchmark)"
BARE_IMGCLS_OPTIMIZER = "bare loop, imgcls's optimizer"


@dataclass
class Measured:
    """Each loop's timed runs, and its Python calls a step from one more, counted, run."""

    runs: dict[str, list[dict[str, float]]]
    calls: dict[str, float]
    chunk: int = 0  # the bare loop interleaved in chunks of this many steps (0: not)


def skips_on_the_device(cfg: DictConfig) -> bool:
    """Whether imgcls's optimizer differs from the user's: RMSprop under an fp16 loss scaler skips an overflowed step
    on the device (training/optimizer.py), where a bare GradScaler reads the flag on the host."""
    cuda = str(cfg.trainer.accelerator) in ("gpu", "cuda")
    fp16 = str(cfg.precision.name) == "amp" and (cuda or bool(cfg.precision.get("cpu_fp16")))
    return fp16 and str(cfg.recipe.optimizer) in ("rmsprop", "rmsprop_tf")


def table(measured: Measured, cfg: DictConfig, steps: int, feature_set: str = "plain") -> str:
    def cell(rows: list[dict[str, float]], key: str) -> str:
        values = [r[key] for r in rows if not math.isnan(r[key])]
        if not values:
            return "-"
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    results = measured.runs
    lines = [
        f"{feature_set}: {cfg.model.arch} @{cfg.model.image_size} px, batch {_batch_size(cfg)}, "
        f"precision={cfg.precision.name}, optimizer={cfg.recipe.optimizer}, ema={cfg.recipe.ema_decay}, "
        f"mixup={cfg.recipe.mixup} ({cfg.recipe.mixup_mode}), drop_path={cfg.model.drop_path_rate}, "
        f"{cfg.trainer.accelerator}, {steps} timed steps x {len(results[BARE])} runs; extra ms: "
        + (
            f"the bare loop interleaved in {measured.chunk}-step chunks, each chunk less the bare ones either side"
            if measured.chunk
            else "each run less the bare loop's run before it"
        )
        + ", median",
        "| loop | ms a step, median (min-max) | CPU ms a step | device ms a step | extra CPU ms over the bare loop, "
        "paired median | extra host ms over the bare loop, paired median | Python calls a step "
        "| extra calls over the bare loop |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, rows in results.items():
        extra = {key: extra_cell(paired_extras(rows, results[BARE], key)) for key in ("host_ms", "cpu_ms")}
        calls, extra_calls = measured.calls[name], measured.calls[name] - measured.calls[BARE]
        counted = f"{calls:.0f} | {extra_calls:+.0f}" if not math.isnan(calls) else "- | -"
        lines.append(
            f"| {name} | {cell(rows, 'host_ms')} | {cell(rows, 'cpu_ms')} | {cell(rows, 'device_ms')} "
            f"| {extra['cpu_ms']} | {extra['host_ms']} | {counted} |"
        )
    return "\n".join(lines)


def extra_cell(extras: list[float]) -> str:
    """The median of the runs' extras, and their spread where there are several: '+1.35 (+1.10 to +1.62)'."""
    median = f"{statistics.median(extras):+.2f}"
    return median if len(extras) < 2 else f"{median} ({min(extras):+.2f} to {max(extras):+.2f})"


def paired_extras(rows: list[dict[str, float]], bare: list[dict[str, float]], key: str) -> list[float]:
    """Each run's extra over the bare loop: with the bare loop interleaved, the run's own (BareChunks: `paired_`
    keys); otherwise the run's figure less the bare loop's run just before it (a VM that slows down for minutes moves
    both runs of a pair alike, so the difference drifts less than the medians apart)."""
    if all(f"paired_{key}" in row for row in rows):
        return [row[f"paired_{key}"] for row in rows]
    return [row[key] - base[key] for row, base in zip(rows, bare, strict=True)]


def paired_extra(rows: list[dict[str, float]], bare: list[dict[str, float]], key: str) -> float:
    """The median of the runs' paired_extras."""
    return statistics.median(paired_extras(rows, bare, key))


def summary(tables: dict[str, Measured]) -> str:
    """One row per feature set: imgcls's median ms a step against its bare loop's, wall and CPU time (the differences:
    paired_extra), and the Python calls a step of the bare loop, Lightning's smallest module and imgcls."""
    lines = [
        "| feature set | bare loop ms | imgcls ms | imgcls - bare, paired median | bare loop CPU ms "
        "| imgcls CPU ms | imgcls - bare, CPU | calls a step: bare / Lightning / imgcls |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, measured in tables.items():
        bare, ours = ({k: statistics.median(r[k] for r in measured.runs[loop]) for k in ("host_ms", "cpu_ms")}
                      for loop in (BARE, IMGCLS))  # fmt: skip
        calls = " / ".join(
            "-" if math.isnan(c) else f"{c:.0f}" for c in (measured.calls[loop] for loop in (BARE, LIGHTNING, IMGCLS))
        )
        extra = {k: paired_extra(measured.runs[IMGCLS], measured.runs[BARE], k) for k in ("host_ms", "cpu_ms")}
        lines.append(
            f"| {name} | {bare['host_ms']:.2f} | {ours['host_ms']:.2f} | {extra['host_ms']:+.2f} "
            f"| {bare['cpu_ms']:.2f} | {ours['cpu_ms']:.2f} | {extra['cpu_ms']:+.2f} | {calls} |"
        )
    return "\n".join(lines)


def run_loop(
    loop: str, cfg: DictConfig, steps: int, warmup: int, count_calls: bool = False, chunk: int = 0
) -> dict[str, float]:
    """One run of `loop`. chunk: Lightning's and imgcls's loops with the bare loop interleaved, `chunk` steps at a
    time (BareChunks); not while calls are counted (the bare steps' calls would count)."""
    interleaved = chunk and not count_calls and loop in (LIGHTNING, IMGCLS)
    chunks = BareChunks(cfg, chunk, steps, warmup) if interleaved else None
    if loop == BARE:
        return bare_loop(cfg, steps, warmup, count_calls=count_calls)
    if loop == LIGHTNING:
        return lightning_loop(cfg, steps, warmup, count_calls=count_calls, chunks=chunks)
    if loop == IMGCLS:
        return imgcls_loop(cfg, count_calls=count_calls, chunks=chunks)
    if loop == BARE_IMGCLS_OPTIMIZER:
        return bare_loop(cfg, steps, warmup, imgcls_optimizer=True, count_calls=count_calls)
    raise ValueError(f"no loop named {loop!r}")


def measure(
    cfg: DictConfig, steps: int, warmup: int, repeats: int, count_calls: bool = True, chunk: int = 0
) -> Measured:
    """Each loop `repeats` times, alternating, so that a machine's drift reaches each loop alike (chunk: and the bare
    loop interleaved with Lightning's and imgcls's, run_loop); then (count_calls) each once more with its Python
    calls counted."""
    loops = [BARE, LIGHTNING, IMGCLS] + ([BARE_IMGCLS_OPTIMIZER] if skips_on_the_device(cfg) else [])
    runs: dict[str, list[dict[str, float]]] = {loop: [] for loop in loops}
    for _ in range(repeats):
        for loop in loops:
            runs[loop].append(run_loop(loop, cfg, steps, warmup, chunk=chunk))
    calls = {loop: run_loop(loop, cfg, steps, warmup, count_calls=True)["calls"] if count_calls else math.nan
             for loop in loops}  # fmt: skip
    return Measured(runs, calls, chunk)


def optimizer_steps(cfg: DictConfig, steps: int) -> str:
    """The optimizer step alone under an fp16 GradScaler, for the set's network and parameter groups, with the same
    random gradients each step and no overflow: timm's or torch's optimizer as a bare loop steps it (unscale_, the
    flag read on the host, the step) against imgcls's (build_optimizer: RMSprop skips an overflowed step on the
    device), stepped as imgcls's precision plugin does (unscale_ first) and as a bare GradScaler.step alone does.
    The three alternate step by step; the table has each one's median CPU time (this thread's) over `steps`."""
    from imgcls.run.plan import resolve_plan
    from imgcls.training.module import ClassificationModule
    from imgcls.training.optimizer import build_optimizer, parameter_groups
    from imgcls.typed_config import to_dict

    plan = resolve_plan(cfg)
    resolved = to_dict(cfg, resolve=True)
    device = torch.device("cuda" if str(cfg.trainer.accelerator) in ("gpu", "cuda") else "cpu")
    classes = [str(i) for i in range(int(cfg.data.num_classes))]
    loops: dict[str, tuple[Any, ...]] = {}
    for name, fused, unscale_first in (
        ("bare GradScaler.step, the user's optimizer", cfg.recipe.optimizer == "sgd", False),
        ("imgcls's optimizer, unscale_ first (imgcls's precision plugin)", True, True),
        ("imgcls's optimizer, GradScaler.step alone", True, False),
    ):
        torch.manual_seed(0)
        module = ClassificationModule(resolved["model"], resolved["recipe"], plan.as_dict(), classes)
        net = module.net.to(device)
        groups = parameter_groups(net, plan.weight_decay, str(module.recipe.weight_decay_on))
        optimizer = build_optimizer(groups, module.recipe, plan.lr, fused=fused)
        scaler = torch.amp.GradScaler(device.type, init_scale=128.0)
        grads = [torch.randn_like(p) * 128.0 for p in net.parameters()]
        loops[name] = (net, optimizer, scaler, grads, unscale_first, [])
    for step in range(steps + 3):
        for net, optimizer, scaler, grads, unscale_first, times in loops.values():
            scaler.scale(torch.ones((), device=device))
            for p, g in zip(net.parameters(), grads, strict=True):
                p.grad = g.clone()
            _wait(device)
            started = time.thread_time()
            if unscale_first:
                scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
            _wait(device)
            if step >= 3:  # imgcls's optimizer lists its tensors in its first two steps
                times.append(1000 * (time.thread_time() - started))
    tensors = sum(1 for _ in next(iter(loops.values()))[0].parameters())
    lines = [
        f"optimizer step: {cfg.model.arch} ({tensors} parameter tensors), optimizer={cfg.recipe.optimizer}, "
        f"{device.type}, {steps} steps each, alternating",
        "| optimizer step | CPU ms, median (min-max) |",
        "|---|---:|",
    ]
    for name, (*_, times) in loops.items():
        lines.append(f"| {name} | {statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f}) |")
    return "\n".join(lines)


def collector_pause() -> str:
    """One line: the container objects Python's collector tracks in this process (after a run: torch, Lightning,
    Hydra, timm), a full collection's ms over all of them, and over those not frozen as a training run freezes them
    (callbacks/garbage_collection.py)."""
    import gc

    tracked = len(gc.get_objects())
    started = time.perf_counter()
    gc.collect()
    full_ms = 1000 * (time.perf_counter() - started)
    gc.freeze()
    started = time.perf_counter()
    gc.collect()
    frozen_ms = 1000 * (time.perf_counter() - started)
    gc.unfreeze()
    return (
        f"garbage collector: {tracked} tracked objects; a full collection {full_ms:.1f} ms, "
        f"{frozen_ms:.1f} ms with them frozen (as training freezes them)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m imgcls.bench.overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="timed steps a run")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each loop, alternating (0: none)")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print imgcls's N costliest functions")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: host time, not core contention)")
    parser.add_argument(
        "--sets",
        default="plain",
        help=f"feature sets, comma-separated (their overrides first): {', '.join(FEATURE_SETS)}",
    )
    parser.add_argument(
        "--optimizer-steps", type=int, default=0, metavar="N", help="also time the optimizer step alone, N steps"
    )
    parser.add_argument(
        "--calls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run each loop once more, counting its Python calls a step (--no-calls: not)",
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=10,
        metavar="K",
        help="run the bare loop inside Lightning's and imgcls's runs, K steps after every K of theirs, and pair "
        "their chunks (0: pair whole runs)",
    )
    parser.add_argument("overrides", nargs="*", help="train.py overrides, e.g. precision=amp model=resnet50")
    args = parser.parse_args(argv)
    feature_sets = [name.strip() for name in args.sets.split(",") if name.strip()]
    unknown = [name for name in feature_sets if name not in FEATURE_SETS]
    if unknown or not feature_sets:
        parser.error(f"--sets: {', '.join(unknown) or 'none given'}; known: {', '.join(FEATURE_SETS)}")
    if not 0 <= args.chunk <= args.steps:
        parser.error(f"--chunk: {args.chunk}; allowed: 0 (pair whole runs) to --steps ({args.steps})")
    torch.set_num_threads(args.threads)
    from imgcls.config.hardware import resolve_auto_hardware

    tables: dict[str, Measured] = {}
    for feature_set in feature_sets:
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory(prefix="imgcls-overhead-") as run_dir:
            cfg = compose(args.overrides, args.steps, args.warmup, run_dir, feature_set)
            resolve_auto_hardware(cfg)
            if args.optimizer_steps:
                print(optimizer_steps(cfg, args.optimizer_steps), flush=True)
            if args.repeats <= 0:
                continue
            tables[feature_set] = measure(cfg, args.steps, args.warmup, args.repeats, args.calls, args.chunk)
            print(table(tables[feature_set], cfg, args.steps, feature_set), flush=True)
            if args.profile:
                print(profile(cfg, args.profile))
    if len(tables) > 1:
        print(summary(tables))
    if tables:
        print(collector_pause())
    return 0


if __name__ == "__main__":
    sys.exit(main())
