"""The host work imgcls adds to a training step (issue 30 item 3): no per-sample Python call in the main process,
no kernel a step from the callbacks, self.log only on the steps Lightning writes; bench.overhead's table."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import timm
import torch
from lightning.pytorch.callbacks import ProgressBar
from timm.layers import DropPath
from timm.optim import RMSpropTF
from timm.utils import ModelEmaV3
from torch.utils._python_dispatch import TorchDispatchMode

import imgcls.run.train
from imgcls.bench import overhead
from imgcls.callbacks.finite_loss import FiniteLoss
from imgcls.callbacks.order import training_callbacks
from imgcls.callbacks.report import ReportCallback
from imgcls.config.checks import check_config
from imgcls.data.datamodule import ClassificationDataModule
from imgcls.data.torchvision.samplers import RankSampler
from imgcls.errors import ConfigError
from imgcls.seeding import sample_seed, sample_seeds
from imgcls.training.ema import ModelEma
from imgcls.training.module import ClassificationModule
from imgcls.training.rmsprop import RMSpropTF as ImgclsRMSpropTF
from tests.conftest import compose_config, tiny_overrides


def test_an_epochs_seeds_made_at_once_equal_the_per_sample_function() -> None:
    indices = np.random.default_rng(1).permutation(5000)
    for seed, epoch in ((0, 0), (12345, 7), (2**40 + 3, 999)):
        assert sample_seeds(seed, epoch, indices).tolist() == [sample_seed(seed, epoch, int(i)) for i in indices]


def test_the_sampler_hands_out_each_samples_seed_without_a_call_per_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    sampler = RankSampler(100, rank=1, world_size=2, shuffle=True, seed=5, drop_last=True, per_sample_seeds=True)
    sampler.set_epoch(3)
    expected = [(i, sample_seed(5, 3, i)) for i in sampler._indices()]
    monkeypatch.setattr("imgcls.seeding.sample_seed", lambda *args: pytest.fail("a Python call per sample"))
    assert list(sampler) == expected


class KernelCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


class StepKernels(L.Callback):
    """Counts the tensor ops FiniteLoss and the report run in their per-step hooks, per optimizer step."""

    def __init__(self) -> None:
        self.ops: dict[int, list[str]] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for callback in trainer.callbacks:
            if isinstance(callback, (FiniteLoss, ReportCallback)):
                for hook in ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end"):
                    if getattr(callback, hook) is not None:  # None: inherited, not called (run/hook_dispatch.py)
                        setattr(callback, hook, self._counted(trainer, getattr(callback, hook)))

    def _counted(self, trainer: L.Trainer, hook: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            step = trainer.global_step
            with KernelCount() as mode:
                result = hook(*args, **kwargs)
            self.ops.setdefault(step, []).extend(mode.ops)
            return result

        return counted


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "amp"])
def test_the_callbacks_run_no_kernel_a_step_but_their_checks(
    precision: str, image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FiniteLoss and the report keep references to each step's loss; the check every K steps reads them. With a
    loss scaler, each optimizer step costs FiniteLoss two ops (the scale's copy and the comparison)."""
    counter = StepKernels()
    real_build = imgcls.run.train.build_trainer
    monkeypatch.setattr(imgcls.run.train, "build_trainer", lambda cfg, plan, callbacks, loggers: real_build(
        cfg, plan, [*callbacks, counter], loggers))  # fmt: skip
    extra = ["precision=amp", "precision.cpu_fp16=true"] if precision == "amp" else []
    # 6 batches an epoch, 2 epochs: checks after steps 10 (every K = 10) and at the epoch ends (6, 12)
    imgcls.run.train.run(compose_config(tiny_overrides(image_folder, "recipe.epochs=2", *extra), run_dir=tmp_path))
    allowed = 2 if precision == "amp" else 0
    per_step = {step: len(ops) for step, ops in counter.ops.items() if step not in (6, 10, 12)}
    assert len(per_step) >= 8 and max(per_step.values()) <= allowed, {s: counter.ops[s] for s in per_step}


@pytest.mark.slow
def test_train_loss_and_lr_are_logged_only_on_the_steps_lightning_writes(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logged: Counter[str] = Counter()
    real_log = ClassificationModule.log

    def log(self: ClassificationModule, name: str, *args: Any, **kwargs: Any) -> None:
        if self.trainer.training:
            logged[name] += 1
        real_log(self, name, *args, **kwargs)

    monkeypatch.setattr(ClassificationModule, "log", log)
    overrides = tiny_overrides(image_folder, "recipe.epochs=2", "trainer.log_every_n_steps=4", "logger=csv")
    imgcls.run.train.run(compose_config(overrides, run_dir=tmp_path))
    # 12 steps: Lightning writes at steps 4, 8, 12 (and the last step of the run, when it stops)
    assert logged["train.loss"] == logged["train.lr"] and 3 <= logged["train.loss"] <= 4, logged
    metrics = (tmp_path / "csv").rglob("metrics.csv")
    rows = [line for path in metrics for line in path.read_text().splitlines()[1:]]
    assert sum(1 for row in rows if re.match(r"^[^,]*\d", row)) >= 3  # the loggers still get train.loss rows


# name, ms a step, the extra host ms (its runs' spread after it, where several), calls a step, extra calls
TABLE_ROW = re.compile(
    r"^\| (.+?) \| ([\d.]+) \(.*?\| .*? \| ([+-][\d.]+)(?: \([+-][\d.]+ to [+-][\d.]+\))? "
    r"\| (\d+|-) \| ([+-]\d+|-) \|$",
    re.M,
)


@pytest.mark.slow
def test_overhead_benchmark_prints_both_loops_and_their_difference(capsys: pytest.CaptureFixture[str]) -> None:
    assert overhead.main(["--steps", "6", "--warmup", "2", "--repeats", "1", "--chunk", "0"]) == 0  # whole runs
    table = capsys.readouterr().out
    rows = {m[1]: (float(m[2]), float(m[3])) for m in TABLE_ROW.finditer(table)}
    calls = {m[1]: (int(m[4]), int(m[5])) for m in TABLE_ROW.finditer(table)}  # Python calls a step, and extra
    assert calls["bare PyTorch loop"][1] == 0 and calls["bare PyTorch loop"][0] > 100
    assert all(abs(extra - (total - calls["bare PyTorch loop"][0])) <= 1 for total, extra in calls.values())
    assert set(rows) == {"bare PyTorch loop", "Lightning, smallest module", "imgcls (mode=benchmark)"}
    pause = re.search(r"^garbage collector: (\d+) tracked objects; a full collection ([\d.]+) ms", table, re.M)
    assert pause is not None and int(pause[1]) > 50_000, table
    cpu = re.findall(r"^\| [^|]+ \| [^|]+ \| ([\d.]+) \(", table, re.M)  # the CPU time column, every loop
    assert len(cpu) == 3 and all(float(ms) > 0 for ms in cpu)
    bare, imgcls_ms = rows["bare PyTorch loop"][0], rows["imgcls (mode=benchmark)"][0]
    assert (
        bare > 0 and imgcls_ms > 0 and rows["imgcls (mode=benchmark)"][1] == pytest.approx(imgcls_ms - bare, abs=0.02)
    )


@pytest.mark.slow
def test_overhead_benchmark_runs_the_published_feature_sets(capsys: pytest.CaptureFixture[str]) -> None:
    """The EfficientNet AMP and TF1 250-epoch sets, each a table; the EfficientNet one adds the bare loop with
    imgcls's optimizer (its device-side overflow skip); a summary row per set."""
    argv = ["--steps", "3", "--warmup", "2", "--repeats", "1", "--chunk", "3", "--sets", "efficientnet_amp,tf1_250e"]
    assert overhead.main(argv) == 0
    out = capsys.readouterr().out
    tables = {t.split(":")[0]: t for t in re.split(r"^(?=(?:efficientnet_amp|tf1_250e): )", out, flags=re.M)}
    efficientnet, tf1 = tables["efficientnet_amp"], tables["tf1_250e"].split("| feature set |")[0]
    assert "optimizer=rmsprop_tf, ema=0.9999" in efficientnet and "drop_path=0.2" in efficientnet
    assert "optimizer=sgd" in tf1 and "mixup=0.2 (elem)" in tf1 and "precision=amp" in tf1
    loops = {"bare PyTorch loop", "Lightning, smallest module", "imgcls (mode=benchmark)"}
    assert {m[1] for m in TABLE_ROW.finditer(efficientnet)} == {*loops, "bare loop, imgcls's optimizer"}
    assert {m[1] for m in TABLE_ROW.finditer(tf1)} == loops
    number, extra = r"[\d.]+", r"[+-][\d.]+"
    calls = r"\d+ / \d+ / \d+"  # bare / Lightning / imgcls
    summary_row = rf"^\| (\w+) \| {number} \| {number} \| {extra} \| {number} \| {number} \| {extra} \| {calls} \|$"
    summary = re.findall(summary_row, out, re.M)
    assert summary == ["efficientnet_amp", "tf1_250e"]


def test_each_chunk_is_paired_with_the_bare_chunks_either_side_so_a_drift_cancels() -> None:
    """A VM speeding down by 10 ms a chunk: each loop chunk 1 ms above the mean of the bare chunks around it. Paired
    with the bare chunk before it alone, the drift would read as +6 ms; whole runs apart, as +10 or more."""
    bare, own = [10.0, 20.0, 30.0, 40.0], [16.0, 26.0, 36.0]
    assert overhead.chunk_extra(own, bare) == pytest.approx(1.0)
    assert overhead.paired_extra([{"host_ms": 26.0, "paired_host_ms": 1.0}], [{"host_ms": 25.0}], "host_ms") == 1.0
    runs = [{"host_ms": 20.0, "paired_host_ms": extra} for extra in (1.5, 0.5, 1.0)]
    cell = overhead.extra_cell(overhead.paired_extras(runs, [{"host_ms": 19.0}] * 3, "host_ms"))
    assert cell == "+1.00 (+0.50 to +1.50)" and overhead.extra_cell([1.0]) == "+1.00"  # the runs' spread, where several
    row = f"| imgcls (mode=benchmark) | 20.00 (19.00-21.00) | 20.00 | 19.00 | {cell} | {cell} | 2771 | +1392 |"
    assert [m.group(1, 3, 4) for m in TABLE_ROW.finditer(row)] == [("imgcls (mode=benchmark)", "+1.00", "2771")]


@pytest.mark.slow
@pytest.mark.parametrize("loop", [overhead.LIGHTNING, overhead.IMGCLS])
def test_the_bare_loop_runs_between_the_loops_chunks(loop: str, tmp_path: Path) -> None:
    """6 timed steps in chunks of 2: bare chunks before the first and after each of the loop's three chunks, each
    of 2 bare steps, after as many warm-up steps as the loop's; the loop's figures are those of its own chunks."""
    cfg = overhead.compose([], 6, 2, str(tmp_path), "plain")
    made: list[overhead.BareChunks] = []
    real = overhead.BareChunks

    def recorded(*args: Any) -> overhead.BareChunks:
        made.append(real(*args))
        return made[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(overhead, "BareChunks", recorded)
        row = overhead.run_loop(loop, cfg, 6, 2, chunk=2)
        counted = overhead.run_loop(loop, cfg, 6, 2, count_calls=True, chunk=2)  # calls counted: no bare steps
    (chunks,) = made
    assert (len(chunks.own), len(chunks.bare), chunks._index) == (3, 4, 2 + 4 * 2)
    assert row["chunks"] == 3 and row["host_ms"] == pytest.approx(sum(wall for wall, _ in chunks.own) / 6 * 1000)
    assert row["paired_host_ms"] == pytest.approx(
        overhead.chunk_extra([w / 2 * 1000 for w, _ in chunks.own], [w / 2 * 1000 for w, _ in chunks.bare])
    )
    assert "chunks" not in counted  # and `(chunks,) = made` above: the counted run made no BareChunks


def test_a_chunk_longer_than_the_timed_steps_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        overhead.main(["--steps", "5", "--chunk", "6"])
    assert exit_info.value.code == 2
    assert "--chunk: 6; allowed: 0 (pair whole runs) to --steps (5)" in capsys.readouterr().err


def test_the_bare_loops_train_what_a_user_would_write(tmp_path: Path) -> None:
    """The EfficientNet AMP set's bare loop: timm's RMSpropTF as it is, torch's GradScaler on, timm's ModelEmaV3, and
    imgcls's network with its drop path; the TF1 set's: torch's fused SGD, fp16 scaling, per-sample mixup 0.2."""
    cfg = overhead.compose([], 1, 1, str(tmp_path), "efficientnet_amp")
    parts = overhead._parts(cfg, 2)
    assert type(parts.optimizer) is RMSpropTF and isinstance(parts.ema, ModelEmaV3) and parts.scaler.is_enabled()
    assert parts.half is torch.float16 and not parts.mixup
    assert any(isinstance(m, DropPath) and m.drop_prob > 0 for m in parts.net.modules())
    assert overhead.skips_on_the_device(cfg)
    assert isinstance(overhead._parts(cfg, 2, imgcls_optimizer=True).optimizer, ImgclsRMSpropTF)
    tf1 = overhead.compose([], 1, 1, str(tmp_path), "tf1_250e")
    parts = overhead._parts(tf1, 2)
    assert isinstance(parts.optimizer, torch.optim.SGD) and parts.optimizer.defaults["fused"]
    assert parts.mixup == 0.2 and parts.ema is None and parts.scaler.is_enabled()
    assert not overhead.skips_on_the_device(tf1)
    images, targets = overhead._training_batch(parts)
    assert images.shape == parts.images.shape and targets.shape == (len(images), parts.num_classes)
    assert torch.allclose(targets.sum(1), torch.ones(len(images)))


def test_the_optimizer_step_table_times_the_users_optimizer_and_imgcls_both_ways(tmp_path: Path) -> None:
    cfg = overhead.compose([], 1, 1, str(tmp_path), "efficientnet_amp")
    table = overhead.optimizer_steps(cfg, 2)
    assert "test_efficientnet (49 parameter tensors), optimizer=rmsprop_tf" in table
    rows = re.findall(r"^\| (.+?) \| ([\d.]+) \(", table, re.M)
    assert [name for name, _ in rows] == [
        "bare GradScaler.step, the user's optimizer",
        "imgcls's optimizer, unscale_ first (imgcls's precision plugin)",
        "imgcls's optimizer, GradScaler.step alone",
    ]
    assert all(float(ms) > 0 for _, ms in rows)


@pytest.mark.slow
def test_fp16_rmsprop_skips_overflows_in_a_fixed_handful_of_ops_a_step(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the real Trainer with fp16 loss scaling (every TF2 EfficientNet AMP run's RMSpropTF): once its lists are
    built (step 0), a whole optimizer step, its overflow skip included, is the same fixed few ops for test_resnet's 47
    parameters (its arithmetic on flat buffers, foreach ops where it walks the parameters), with no unscaling of its
    own (the precision plugin's unscale_ has done it, in the same pass as its overflow check), and each step checks
    the gradients once. timm's own step alone was some 500 ops here; the copy-and-select skip added 7 to them."""
    per_step: list[list[str]] = []
    real_step = ImgclsRMSpropTF.step

    def counted_step(self: Any, closure: Any = None) -> Any:
        if closure is not None:  # the forward and backward are not the step's
            closure()
        with KernelCount() as mode:
            result = real_step(self)
        per_step.append(mode.ops)
        return result

    monkeypatch.setattr(ImgclsRMSpropTF, "step", counted_step)
    checks: list[int] = []
    real_unscale = torch.amp.GradScaler.unscale_

    def unscale_(self: torch.amp.GradScaler, optimizer: Any) -> None:
        with KernelCount() as mode:
            real_unscale(self, optimizer)
        checks.append(mode.ops.count("aten._amp_foreach_non_finite_check_and_unscale_.default"))

    monkeypatch.setattr(torch.amp.GradScaler, "unscale_", unscale_)
    overrides = tiny_overrides(image_folder, "recipe.epochs=1", "precision=amp", "precision.cpu_fp16=true",
                               "model.channels_last=false", "recipe.optimizer=rmsprop_tf", "recipe.rmsprop_alpha=0.9",
                               "recipe.rmsprop_eps=0.001")  # fmt: skip
    imgcls.run.train.run(compose_config(overrides, run_dir=tmp_path))
    assert len(per_step) == 6 and checks == [1] * 6
    counts = {len(ops) for ops in per_step[1:]}
    assert len(counts) == 1 and counts.pop() <= 40, per_step[1]
    assert not any(op.startswith("aten._foreach_mul_") for ops in per_step[1:] for op in ops), per_step[1]


@pytest.mark.parametrize("kind", ["rich", "tqdm"])
def test_the_progress_bar_is_redrawn_every_n_steps(kind: str, tmp_path: Path, image_folder: Path) -> None:
    cfg = compose_config(tiny_overrides(image_folder, f"callbacks.progress_bar={kind}"), run_dir=tmp_path)
    datamodule = ClassificationDataModule(cfg.data, batch_size=8)
    callbacks, _ = training_callbacks(cfg, tmp_path, datamodule)
    bars = [c for c in callbacks if isinstance(c, ProgressBar)]
    assert len(bars) == 1 and bars[0].refresh_rate == 10
    with pytest.raises(ConfigError, match="callbacks.progress_bar_every_n_steps=0"):
        check_config(compose_config(tiny_overrides(image_folder, "callbacks.progress_bar_every_n_steps=0")))


def test_the_tracked_ema_update_equals_timms_and_walks_no_state_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    net = timm.create_model("test_resnet", num_classes=4)
    theirs, ours = ModelEmaV3(net, decay=0.9), ModelEma(net, decay=0.9)
    ours.track(net)
    net(torch.randn(2, 3, 16, 16))  # BatchNorm statistics and num_batches_tracked move
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1)
    walks: list[str] = []
    real = torch.nn.Module.state_dict
    monkeypatch.setattr(
        torch.nn.Module, "state_dict", lambda self, *a, **k: walks.append("walk") or real(self, *a, **k)
    )
    for step in (1, 2, 3):
        ours.update(net, step=step)
    assert walks == []
    monkeypatch.setattr(torch.nn.Module, "state_dict", real)
    for step in (1, 2, 3):
        theirs.update(net, step=step)
    for (name, a), b in zip(theirs.module.state_dict().items(), ours.module.state_dict().values()):
        assert torch.equal(a, b), name
    other = timm.create_model("test_resnet", num_classes=4)  # not the tracked network: timm's own update
    theirs.update(other, step=4)
    ours.update(other, step=4)
    assert all(
        torch.equal(a, b) for a, b in zip(theirs.module.state_dict().values(), ours.module.state_dict().values())
    )
