"""`python train.py mode=benchmark ...` (NVIDIA benchmark_training): training throughput, nothing else.

The run's own model, precision, batch, data backend (real folders or `data=synthetic`) and Trainer, for
benchmark.warmup + benchmark.iterations training iterations (micro-batches); only the iterations after
the warm-up are timed. Reports NVIDIA's train.total_ips, train.compute_ips, train.data_time and
train.compute_time to RUN_DIR/benchmark.json and stdout. The per-step callbacks are a training run's own
(imgcls.callbacks.order.training_callbacks: report, NaN and preemption checks, progress bar), so the timed loop is
the real one; the benchmark's timer is added on top. No checkpoint callbacks, no validation, no loggers.

The run is one epoch of exactly warmup + iterations batches on every rank, so the timed window holds steps only:
an epoch end (the report's all-reduce, FiniteLoss's check, the epoch line), validation or a checkpoint inside it
would be timed as if every step paid for it. data=synthetic's train split is sized to that; real data whose epoch
is shorter is refused in one line.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, open_dict

from imgcls.callbacks.host_syncs import ThreadSyncCounter
from imgcls.callbacks.order import training_callbacks
from imgcls.config.checks import check_config
from imgcls.config.hardware import resolve_auto_hardware
from imgcls.data.datamodule import ClassificationDataModule
from imgcls.errors import ConfigError
from imgcls.run.plan import resolve_plan
from imgcls.run.trainer import build_trainer
from imgcls.storage import write_json_atomic
from imgcls.training.module import ClassificationModule
from imgcls.training.timing import StepTimer
from imgcls.typed_config import to_dict

log = logging.getLogger(__name__)


class BenchmarkTimer(L.Callback):
    """Times the iterations after `warmup` with the report's per-batch timer (data wait vs compute, CUDA
    events on a GPU), and stops training after warmup + iterations. The clock stops when the device has
    finished the last timed iteration: not after fit returns, which would add the epoch-end checkpoint and
    the teardown (on one H200 that cut resnet50 AMP's img/s by 40%)."""

    def __init__(self, warmup: int, iterations: int) -> None:
        self.warmup = warmup
        self.iterations = iterations
        self.seen = 0
        self.timer = StepTimer()
        self.metrics: dict[str, float] = {}
        self._sync_counter: ThreadSyncCounter | None = None  # while host syncs are counted (CUDA)

    def _count_host_syncs(self, device: torch.device) -> None:
        """On CUDA, count the host syncs of the timed iterations: torch's sync debug mode warns at each
        synchronizing call (.item(), a device-to-host copy, a stream sync). Zero cost where there are none."""
        if device.type != "cuda":
            return
        self._sync_counter = ThreadSyncCounter()
        self._sync_counter.start()
        torch.cuda.set_sync_debug_mode("warn")

    def _host_syncs(self) -> dict[str, float]:
        if self._sync_counter is None:
            return {}
        torch.cuda.set_sync_debug_mode("default")
        syncs = self._sync_counter.stop()
        self._sync_counter = None
        return {
            "train.host_syncs_per_step": syncs / self.iterations,
            # Asserted by make gpu-check inside the training process: precision=tf32 must have switched TF32 on.
            "cuda.tf32": float(torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32),
        }

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        window = self.warmup + self.iterations
        if trainer.num_training_batches < window:  # (inf: a loader without a length never ends an epoch)
            raise ConfigError(
                f"benchmark.warmup + benchmark.iterations = {self.warmup} + {self.iterations} = {window} iterations "
                f"a rank, but an epoch of the train data is {trainer.num_training_batches} batches a rank "
                f"({trainer.world_size} rank(s)): at most {trainer.num_training_batches} in all, so that no epoch end "
                "is timed; or data=synthetic"
            )
        self.timer.reset()  # warmup=0: the first batch's data wait counts from here
        if self.warmup == 0:
            self._count_host_syncs(pl_module.device)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._host_syncs()  # the debug mode and the warning filters back as they were

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.seen >= self.warmup:
            self.timer.batch_started(pl_module.device)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.seen >= self.warmup:
            self.timer.batch_ended(len(batch[1]), pl_module.device)
        self.seen += 1
        if self.seen == self.warmup:
            if pl_module.device.type == "cuda":
                torch.cuda.synchronize(pl_module.device)
            self.timer.reset()  # the clock starts when the last warm-up iteration has finished
            self._count_host_syncs(pl_module.device)
        if self.seen == self.warmup + self.iterations:
            syncs = self._host_syncs()  # before the summary's own (one) sync
            self.metrics = {**self.timer.summary("train", trainer.world_size), **syncs}  # waits for the device, once
        if self.seen >= self.warmup + self.iterations:
            trainer.should_stop = True


def window_config(cfg: DictConfig, window: int, samples_per_step: int) -> DictConfig:
    """A copy of `cfg` whose fit is one epoch of `window` batches a rank, then stops: nothing but steps until the
    timer's last iteration. `samples_per_step`: the per-device batch times the world size."""
    cfg = cfg.copy()
    with open_dict(cfg):
        trainer = cfg.trainer
        # The run length is the benchmark's: the epoch ends with the last timed iteration (the LR schedule
        # still spans recipe.epochs of such epochs: finite).
        trainer.max_epochs, trainer.min_epochs, trainer.max_steps, trainer.min_steps = 1, None, -1, None
        trainer.limit_train_batches = window
        trainer.overfit_batches, trainer.fast_dev_run = 0.0, False  # both would shorten the epoch
        trainer.limit_val_batches, trainer.num_sanity_val_steps = 0, 0  # NVIDIA benchmark_training: no validation
        cfg.callbacks.checkpoint = None  # no ckpt (conf/train.yaml `mode:`): not after the window either
        cfg.callbacks.early_stopping_patience = None  # it monitors validation, which a benchmark has none of
        if cfg.data.backend == "synthetic":  # the same batch every step: an epoch of any length costs nothing
            cfg.data.train_samples = window * samples_per_step
    return cfg


def run(cfg: DictConfig) -> dict[str, Any]:
    resolve_auto_hardware(cfg)  # hardware=auto: the profile of this machine's GPUs, timed as it would train
    check_config(cfg)
    bench = cfg.get("benchmark") or {}
    warmup, iterations = int(bench.get("warmup", 10)), int(bench.get("iterations", 50))
    run_dir = Path(cfg.run_dir)
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    plan = resolve_plan(cfg)
    cfg = window_config(cfg, warmup + iterations, plan.per_device_batch * plan.world_size)
    datamodule = ClassificationDataModule(cfg.data, batch_size=plan.per_device_batch, seed=int(cfg.seed))
    resolved = to_dict(cfg, resolve=True)
    module = ClassificationModule(
        model=resolved["model"], recipe=resolved["recipe"], plan=plan.as_dict(), classes=datamodule.classes
    )
    if cfg.get("compile"):
        module.compile_network()  # as train.py does

    timer = BenchmarkTimer(warmup, iterations)
    callbacks, _ = training_callbacks(cfg, run_dir, datamodule)
    trainer = build_trainer(cfg, plan, [*callbacks, timer], [])
    trainer.fit(module, datamodule=datamodule)
    if timer.timer.batches < iterations:
        raise ConfigError(f"the benchmark ran {timer.timer.batches} of {iterations} timed iterations")
    metrics = timer.metrics
    document = {
        "mode": "benchmark_training",
        "model": cfg.model.arch,
        "precision": cfg.precision.name,
        "data.backend": cfg.data.backend,
        "per_device_batch": plan.per_device_batch,
        "world_size": plan.world_size,
        "warmup": warmup,
        "iterations": iterations,
        **metrics,
    }
    if trainer.is_global_zero:
        write_json_atomic(run_dir / "benchmark.json", document)
        print(json.dumps(document, indent=2))
    return metrics
