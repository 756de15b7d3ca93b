"""No host synchronisation per training or validation step (docs/reliability.md, "Host syncs"), on one rank or two.

A sync makes the CPU wait until the GPU has drained its queue, so the next step's kernels are launched late.
On a CPU the same calls are visible: every call that would block on a GPU tensor is counted (patched to count,
then run for real) during a real fit, per micro-batch."""

from __future__ import annotations

import json
import threading
import traceback
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.distributed as dist

import imgcls.distributed
import imgcls.run.train
import imgcls.training.timing
from imgcls.bench.training import BenchmarkTimer
from imgcls.callbacks.host_syncs import SYNC_WARNING
from imgcls.distributed import SYNC_EVERY_N_STEPS
from imgcls.training.timing import StepTimer
from tests import warm_python
from tests.conftest import ROOT, clean_env, compose_config, free_port, tiny_overrides
from tests.fake_clock import FakeClock
from tests.test_amp import FP16_NET

# Host-side data loading (decode, augment; in the main process with num_workers=0) calls .item() on CPU
# tensors that never touch a GPU: not syncs.
_LOADER_FRAMES = ("torchvision/", "/imgcls/data/", "torch/utils/data/", "PIL/")


class SyncCounter(L.Callback):
    """Attributes each blocking call to the micro-batch it happens in: a training batch (from its start to the next
    batch's) or a validation batch (likewise). Epoch ends, validation's start and end, and what runs there are not
    per-step and are left out.

    A DeferredRead (imgcls/distributed.py) read in a later micro-batch than the one that started it is not a sync:
    on a GPU it waits for an event recorded behind work queued then, long finished, not for the queue; its
    collective was started by every rank then too. Such reads are listed in `deferred` (started, read: training
    micro-batches) and what they call is not counted; one read in the micro-batch that started it is a sync."""

    def __init__(self) -> None:
        self.phase = "train"
        self.batch: int | None = None
        self.started = 0
        self.val_started = 0
        self.calls: dict[int, list[str]] = defaultdict(list)
        self.val_calls: dict[int, list[str]] = defaultdict(list)
        self.deferred: list[tuple[int, int]] = []
        self.paused = False

    def position(self) -> tuple[str, int] | None:
        return None if self.batch is None else (self.phase, self.batch)

    def record(self, name: str) -> None:
        if self.batch is None or self.paused:
            return
        stack = traceback.extract_stack()[:-2]
        if any(marker in frame.filename for frame in stack for marker in _LOADER_FRAMES):
            return
        where = next(
            (
                f"{f.filename.split('/')[-1]}:{f.lineno} {f.name}"
                for f in reversed(stack)
                if "site-packages/torch/" not in f.filename
            ),
            "?",
        )
        (self.val_calls if self.phase == "val" else self.calls)[self.batch].append(f"{name} at {where}")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        self.phase, self.batch = "train", self.started
        self.started += 1

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.batch = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.batch = None

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int, dataloader_idx: int = 0
    ) -> None:
        self.phase, self.batch = "val", self.val_started
        self.val_started += 1

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.batch = None  # the metrics' compute (module hook, after this one) gathers once an epoch


def count_syncs(monkeypatch: pytest.MonkeyPatch, counter: SyncCounter) -> None:
    def counting(owner: Any, name: str, when: Any = None) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if when is None or when(*args, **kwargs):
                counter.record(f"{getattr(owner, '__name__', owner)}.{name}")
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy"):
        counting(torch.Tensor, name)
    counting(torch.cuda, "synchronize")
    counting(torch.cuda.Event, "synchronize")
    counting(torch.cuda.Event, "elapsed_time")
    # A collective started with async_op=True returns at once; what waits for it is Work.wait().
    counting(dist, "all_reduce", when=lambda *args, **kwargs: not kwargs.get("async_op"))
    counting(dist.Work, "wait")
    counting(dist, "broadcast")  # Lightning's per-batch SIGTERM flag under DDP (callbacks/preemption.py)
    counting(dist, "all_gather_object")
    counting(torch.amp.GradScaler, "get_scale")
    # A Python number made into a GPU tensor is a host-to-device copy that waits for the queue (self.log(float)).
    # Not counted: device="cpu" spelled out, which stays on the host on any machine (timm's optimizers keep their
    # step counters there); a training-device tensor is made with a torch.device (self.device), on CPU runs too.
    counting(torch, "tensor", when=lambda *args, **kwargs: kwargs.get("device") not in (None, "cpu"))
    counting(torch, "as_tensor", when=lambda *args, **kwargs: kwargs.get("device") not in (None, "cpu"))
    deferred = imgcls.distributed.DeferredRead
    real_start, real_values = deferred.__init__, deferred.values

    def start(self: Any, *args: Any, **kwargs: Any) -> None:
        real_start(self, *args, **kwargs)
        self.counted_at = counter.position()

    def values(self: Any) -> list[Any]:
        started, now = self.counted_at, counter.position()
        if now is None or started == now:
            counter.record("DeferredRead.values in the micro-batch that started it")
            return real_values(self)
        if started is not None and started[0] == now[0] == "train":
            counter.deferred.append((started[1], now[1]))
        counter.paused = True
        try:
            return real_values(self)
        finally:
            counter.paused = False

    monkeypatch.setattr(deferred, "__init__", start)
    monkeypatch.setattr(deferred, "values", values)
    real_build = imgcls.run.train.build_trainer

    def build_trainer(cfg, plan, callbacks, loggers):  # noqa: ANN001, ANN202 - the counter first, then the real run's
        return real_build(cfg, plan, [counter, *callbacks], loggers)

    monkeypatch.setattr(imgcls.run.train, "build_trainer", build_trainer)


def syncing(calls: dict[Any, list[str]], what: str) -> str:
    """The micro-batches that synced, one a line ("" if none)."""
    return "\n".join(f"{what} batch {batch}: {found}" for batch, found in calls.items() if found)


@pytest.mark.slow
@pytest.mark.parametrize("bar", ["none", "rich"])  # rich: the default progress bar
def test_default_training_loop_does_not_sync_per_step(
    bar: str, image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No micro-batch syncs, training or validation: FiniteLoss's check used to read its flags with .tolist() at
    every 10th step, and the val loss's MeanMetric(weight=len(labels)) made a device tensor of the weight and
    checked it and the loss for NaN with two .any()s at every validation batch."""
    counter = SyncCounter()
    count_syncs(monkeypatch, counter)
    # A bar draws only on a terminal (callbacks/console.py), which pytest's captured output is not.
    monkeypatch.setattr("imgcls.callbacks.console.on_a_terminal", lambda kind: True)
    # 6 batches an epoch, 4 epochs: 24 optimizer steps, past the FiniteLoss checks at steps K = 10 and 2K
    overrides = tiny_overrides(
        image_folder, "recipe.epochs=4", f"callbacks.progress_bar={bar}", f"trainer.enable_progress_bar={bar != 'none'}"
    )
    imgcls.run.train.run(compose_config(overrides, run_dir=tmp_path))
    assert counter.started == 24 and counter.val_started > 4
    assert not syncing(counter.calls, "train"), syncing(counter.calls, "train")
    assert not syncing(counter.val_calls, "val"), syncing(counter.val_calls, "val")


# The training step of each published experiment's feature set (conf/experiment/: every one smooths its labels),
# at its largest: each other experiment's step is one of these less a feature, or fp32 instead of fp16 loss scaling
# (amp -> fp16 autocast with GradScaler("cpu")); fp16 SGD is test_amp_sync's. Cutmix is in no published recipe.
# AutoAugment off: it runs in the loader, not in the step, and costs CPU time here.
AMP = ("precision=amp", "precision.cpu_fp16=true", "model.channels_last=false", FP16_NET)
FEATURE_SETS = {
    # tf2_efficientnet_b4_8x*_amp: TF's RMSprop, EMA with TF's warmup, per-sample mixup, fp16
    "tf2_b4": ("recipe=tf2_efficientnet", "recipe.mixup=0.2", "recipe.augment=null", *AMP),
    "tf1_250e": ("recipe=tf1_250e",),  # tf1_*_250e: SGD, per-sample mixup
    "efficientnet": ("recipe=efficientnet", "recipe.augment=null", *AMP),  # efficientnet_*_amp: RMSprop, batch mixup
    "cutmix_elem": ("recipe=tf1_250e", "recipe.cutmix=1.0"),  # per sample, mixup or cutmix
    "cutmix_batch": ("recipe=250e", "recipe.cutmix=1.0"),  # resnet50_*_250e's per-batch mixup, or cutmix
}


@pytest.mark.slow
@pytest.mark.parametrize("features", list(FEATURE_SETS))
def test_published_feature_sets_do_not_sync_per_step(
    features: str, image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = SyncCounter()
    count_syncs(monkeypatch, counter)
    # 6 batches an epoch, 2 epochs: 12 optimizer steps, past the FiniteLoss check at step K = 10
    overrides = tiny_overrides(image_folder, *FEATURE_SETS[features], "recipe.epochs=2", "trainer.limit_val_batches=0")
    imgcls.run.train.run(compose_config(overrides, run_dir=tmp_path))
    assert counter.started == 12
    assert not syncing(counter.calls, "train"), syncing(counter.calls, "train")


@pytest.mark.slow
def test_ddp_training_and_validation_do_not_sync_per_step(image_folder: Path, tmp_path: Path) -> None:
    """The same count on each of 2 gloo ranks (Lightning's launcher). Lightning broadcast a SIGTERM flag from rank 0
    and read it with .item() at every training batch; Preemption and FiniteLoss then agreed on their flags with
    Lightning's reduce_boolean_decision every 10th step (a device tensor made of a host bool, a blocking
    all-reduce, bool() of the result: 5 syncs with FiniteLoss's .tolist()). Now each check starts an all-reduce
    that the next check reads, K optimizer steps later. EMA on: validation updates the val and val_ema metrics."""
    overrides = tiny_overrides(
        image_folder,
        "recipe.epochs=8",
        "recipe.ema_decay=0.9",
        "callbacks.progress_bar=none",
        "trainer.enable_progress_bar=false",
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "data.batch_size=4",
    )
    env = {**clean_env(), "MASTER_PORT": str(free_port())}
    result = warm_python.run([ROOT / "tests" / "count_host_syncs.py", str(tmp_path), *overrides], base_env=env,
                             timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    k = SYNC_EVERY_N_STEPS
    for rank in (0, 1):
        counts = json.loads((tmp_path / f"syncs-rank{rank}.json").read_text())
        assert counts["started"] >= 2 * k and counts["val_started"] > 8
        assert not syncing(counts["calls"], f"rank {rank} train"), syncing(counts["calls"], f"rank {rank} train")
        assert not syncing(counts["val_calls"], f"rank {rank} val"), syncing(counts["val_calls"], f"rank {rank} val")
        # Preemption's flags, read on the step path a period after they were started, at the checks' batches
        # (FiniteLoss's are read sooner, at each epoch end); on rank 0 also the progress lines' losses
        # (callbacks.log_every_n_steps=20), each read at the micro-batch after its step, but an epoch's last (read
        # at the epoch's end).
        deferred = [tuple(pair) for pair in counts["deferred"]]  # (started, read) micro-batches, JSON lists
        flags = [(started, read) for started, read in deferred if read - started != 1]
        assert flags and all(read - started == k and (read + 1) % k == 0 for started, read in flags), deferred
        steps, per_epoch = counts["started"], counts["started"] // 8
        lines = [(step - 1, step) for step in range(20, steps + 1, 20) if step % per_epoch] if rank == 0 else []
        assert [pair for pair in deferred if pair not in flags] == lines, deferred


def test_report_timer_on_cuda_reads_events_once_per_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU branch of the report's timer, structurally (no CUDA here): events per batch, no
    torch.cuda.synchronize per batch, one event sync when the epoch's summary is made. On a fake clock (the host's
    and the events' alike): the times are exactly the ones made here, whatever the machine's speed or load."""
    clock = FakeClock()
    monkeypatch.setattr(imgcls.training.timing, "time", clock)

    class Event:  # records the clock's time; stands in for torch.cuda.Event
        made: list[Event] = []

        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.at, self.synced = 0.0, 0
            Event.made.append(self)

        def record(self) -> None:
            self.at = clock.perf_counter()

        def synchronize(self) -> None:
            self.synced += 1

        def elapsed_time(self, end: Event) -> float:
            return (end.at - self.at) * 1000.0

    syncs: list[Any] = []
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: syncs.append(args))
    timer, cuda = StepTimer(), torch.device("cuda")
    for _ in range(5):
        timer.batch_started(cuda)
        clock.sleep(0.02)  # the step
        timer.batch_ended(4, cuda)
        clock.sleep(0.001)  # the wait for the next batch
    assert len(Event.made) == 10 and sum(e.synced for e in Event.made) == 0 and syncs == []
    clock.sleep(0.3)  # validation runs before the epoch's summary: not training time
    summary = timer.summary("train", 1)
    assert sum(e.synced for e in Event.made) == 1 and syncs == []
    assert timer.compute_time == pytest.approx(5 * 0.02)
    assert summary["train.compute_ips"] == pytest.approx(20 / (5 * 0.02))
    # The wall time ends with the last batch (5 steps, 4 waits between them), not at the summary.
    assert 20 / summary["train.total_ips"] == pytest.approx(5 * 0.02 + 4 * 0.001)


def test_benchmark_counts_the_training_threads_syncs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """mode=benchmark's train.host_syncs_per_step: the sync warnings of the thread that runs the step, not those of
    the DataLoader's pin-memory thread (an is_pinned check per batch: 481 of 495 counted on one H200). The CUDA
    debug mode is a no-op here; the warnings are raised as torch raises them, through Python's warnings."""
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    shown: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kwargs: shown.append(str(message)))
    timer = BenchmarkTimer(warmup=0, iterations=2)
    timer._count_host_syncs(torch.device("cuda"))

    def pin_memory_thread() -> None:
        for _ in range(3):
            warnings.warn(f"called a {SYNC_WARNING}", UserWarning, stacklevel=1)

    other = threading.Thread(target=pin_memory_thread)
    other.start()
    other.join()
    warnings.warn(f"called a {SYNC_WARNING}", UserWarning, stacklevel=1)  # the training step's
    warnings.warn(f"called a {SYNC_WARNING}", UserWarning, stacklevel=1)  # (not once per call site)
    warnings.warn("something else", UserWarning, stacklevel=1)
    metrics = timer._host_syncs()
    assert metrics["train.host_syncs_per_step"] == 2 / 2
    assert shown == []  # none printed while counting, the other threads' included
    warnings.warn("after", UserWarning, stacklevel=1)
    assert shown == ["after"]  # the warning machinery as it was


class _SyncingModule(L.LightningModule):
    """Raises torch's sync warning as a GPU would: once a training step, twice a validation step, and once in each
    epoch-end hook (not a step's: outside every window)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def _sync(self) -> None:
        warnings.warn(f"called a {SYNC_WARNING}", UserWarning, stacklevel=1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._sync()
        return torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._sync()
        self._sync()

    def on_validation_epoch_end(self) -> None:
        self._sync()

    def on_train_epoch_end(self) -> None:
        self._sync()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_host_sync_count_reports_training_and_validation_steps_apart(tmp_path: Path) -> None:
    """callbacks.count_host_syncs (make gpu-check's training rows): train.host_syncs_per_step and
    val.host_syncs_per_step in the report's rows, each a step's own; the sanity check and the epoch ends excluded.
    The CUDA debug mode is off here (debug_mode=False): the module raises the warnings as torch would."""
    from imgcls.callbacks.host_syncs import HostSyncCount
    from imgcls.callbacks.report import ReportCallback

    data = torch.utils.data.TensorDataset(torch.randn(12, 4), torch.randint(0, 2, (12,)))
    loader = torch.utils.data.DataLoader(data, batch_size=2)  # 6 batches
    report = ReportCallback(tmp_path)
    counter = HostSyncCount(report, debug_mode=False)
    trainer = L.Trainer(
        max_epochs=2, limit_val_batches=3, num_sanity_val_steps=2, val_check_interval=0.5, callbacks=[report, counter],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(_SyncingModule(), train_dataloaders=loader, val_dataloaders=loader)
    assert counter.steps == {"train": 12, "val": 12}  # 4 validations of 3 batches, mid-epoch ones included
    assert report.counters == {"train.host_syncs_per_step": 1.0, "val.host_syncs_per_step": 2.0}
    assert report.rows[-1]["val.host_syncs_per_step"] == 2.0
    warnings.warn("after", UserWarning, stacklevel=1)  # the filters are back: shown again (pytest records it)
    assert not counter.counter.counting
