"""Benchmarks: evaluate.py mode=benchmark (inference table) and train.py mode=benchmark (training ips)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

import imgcls.bench.training
import imgcls.run.train
import imgcls.training.timing
from imgcls.bench.inference import check_batch_sizes, markdown_table, measure
from imgcls.bench.training import BenchmarkTimer
from imgcls.cli import run_evaluate as evaluate
from imgcls.cli import run_train
from imgcls.errors import ConfigError
from tests import warm_python
from tests.conftest import ROOT, assert_one_line_error, compose_config, run_clis, tiny_overrides, tiny_run
from tests.fake_clock import FakeClock


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    return tiny_run(tmp_path_factory, image_folder)


class SlowStart(nn.Module):
    """A network whose first `slow` calls take 0.2 s and the rest 1 ms, on the fake clock the timing reads."""

    def __init__(self, slow: int, clock: FakeClock) -> None:
        super().__init__()
        self.slow, self.clock = slow, clock
        self.calls = 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.clock.sleep(0.2 if self.calls <= self.slow else 0.001)
        return images.mean(dim=(2, 3))


def test_inference_warmup_is_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    from imgcls.bench import inference

    clock = FakeClock()  # the latencies are the ones made here, whatever the machine's speed or load
    monkeypatch.setattr(inference, "time", clock)
    net = SlowStart(slow=3, clock=clock)
    row = measure(net, batch_size=2, image_size=8, device=torch.device("cpu"), warmup=3, iterations=5)
    assert net.calls == 8 and row["iterations"] == 5
    assert row["latency_p99_ms"] == pytest.approx(1.0)  # a timed warm-up call would be 200 ms
    assert row["latency_avg_ms"] == pytest.approx(1.0) and row["throughput_ips"] == pytest.approx(2 / 0.001)


@pytest.mark.slow
def test_benchmark_table_for_a_checkpoint(trained: Path, tmp_path: Path, capsys) -> None:
    cfg = compose_config(
        [
            "mode=benchmark",
            f"ckpt={trained / 'checkpoints' / 'last.ckpt'}",
            "batch_sizes=[1,2,4]",
            "benchmark.warmup=1",
            "benchmark.iterations=4",
        ],
        config_name="evaluate",
        run_dir=tmp_path,
    )
    document = evaluate(cfg)
    rows = document["rows"]
    assert [r["batch_size"] for r in rows] == [1, 2, 4] and document["image_size"] == 32
    for row in rows:
        assert 0 < row["latency_avg_ms"] <= row["latency_p99_ms"] and row["latency_p90_ms"] <= row["latency_p95_ms"]
        assert row["iterations"] == 4
    assert json.loads((tmp_path / "benchmark.json").read_text())["rows"] == rows
    out = capsys.readouterr().out
    assert markdown_table(rows) in out
    assert "| Batch size | Throughput (img/s) | Latency avg (ms) | Latency p90 (ms)" in out


def test_benchmark_with_random_weights_and_bf16(tmp_path: Path) -> None:
    cfg = compose_config(
        ["mode=benchmark", "model=resnet18", "precision=bf16", "batch_sizes=[2]", "benchmark.warmup=1",
         "benchmark.iterations=2", "benchmark.image_size=32"],
        config_name="evaluate",
        run_dir=tmp_path,
    )  # fmt: skip
    document = evaluate(cfg)
    assert document["model"] == "resnet18" and document["autocast"] == "bfloat16" and document["channels_last"]
    assert document["ckpt"] is None and len(document["rows"]) == 1


@pytest.mark.parametrize(("precision", "tf32"), [("fp32", False), ("tf32", True), ("amp", True)])
def test_inference_benchmark_sets_tf32_as_training_does(
    precision: str, tf32: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from imgcls.bench import inference

    flags: list[tuple[bool, bool, str]] = []
    real_measure = inference.measure

    def measure(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - records the switches the timing runs under
        flags.append(
            (
                torch.backends.cuda.matmul.allow_tf32,
                torch.backends.cudnn.allow_tf32,
                torch.get_float32_matmul_precision(),
            )
        )
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(inference, "measure", measure)
    backends = torch.backends
    previous = backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    try:  # start from the opposite of what the precision asks for
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not tf32
        torch.set_float32_matmul_precision("highest" if tf32 else "high")
        cfg = compose_config(
            ["mode=benchmark", "model=resnet18", f"precision={precision}", "batch_sizes=[1]", "benchmark.warmup=0",
             "benchmark.iterations=1", "benchmark.image_size=32"],
            config_name="evaluate", run_dir=tmp_path,
        )  # fmt: skip
        document = evaluate(cfg)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous[:2]
        torch.set_float32_matmul_precision(previous[2])
    assert flags == [(tf32, tf32, "high" if tf32 else "highest")] and document["tf32"] is tf32


@pytest.mark.parametrize("values", [[], [0], [4, -1], ["a"], [1.5]])
def test_bad_batch_sizes(values: list) -> None:
    with pytest.raises(ConfigError, match="batch_sizes="):
        check_batch_sizes(values)
    assert check_batch_sizes([1, 8, 256]) == [1, 8, 256]


def test_training_benchmark_timer_excludes_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()  # the report's timer reads it: exact times, whatever the machine's speed or load
    monkeypatch.setattr(imgcls.training.timing, "time", clock)
    timer = BenchmarkTimer(warmup=2, iterations=3)
    trainer = SimpleNamespace(should_stop=False, world_size=1, num_training_batches=5)
    module = SimpleNamespace(device=torch.device("cpu"))
    batch = (None, [0] * 4)
    timer.on_train_start(trainer, module)
    for i in range(5):
        clock.sleep(0.001)  # the wait for the batch
        timer.on_train_batch_start(trainer, module, batch, i)
        clock.sleep(0.2 if i < 2 else 0.01)  # slow warm-up iterations
        timer.on_train_batch_end(trainer, module, None, batch, i)
        assert trainer.should_stop == (i == 4)
    clock.sleep(0.5)  # what follows the last timed iteration: the epoch-end checkpoint, the teardown
    summary = timer.metrics
    assert timer.timer.batches == 3 and timer.timer.samples == 12
    assert summary["train.compute_time"] == pytest.approx(0.01) and summary["train.compute_ips"] == pytest.approx(
        12 / 0.03
    )
    assert summary["train.data_time"] == pytest.approx(0.001)
    # The wall clock started when the last warm-up iteration ended and stopped with the last timed one.
    assert summary["train.total_ips"] == pytest.approx(12 / (3 * 0.011))


@pytest.mark.slow
def test_train_mode_benchmark_runs_timed_iterations_only(image_folder: Path, tmp_path: Path) -> None:
    overrides = tiny_overrides(image_folder, "mode=benchmark", "benchmark.warmup=2", "benchmark.iterations=4")
    # 2 + 4 iterations: the whole epoch of 6 batches (one more is refused: tests/test_benchmark_window.py).
    metrics = run_train(compose_config(overrides, run_dir=tmp_path))
    document = json.loads((tmp_path / "benchmark.json").read_text())
    assert document["iterations"] == 4 and document["mode"] == "benchmark_training"
    for name in ("train.total_ips", "train.compute_ips", "train.data_time", "train.compute_time"):
        assert metrics[name] > 0 and document[name] == metrics[name]
    assert metrics["train.compute_ips"] >= metrics["train.total_ips"]


@pytest.mark.slow
def test_train_mode_benchmark_runs_the_callbacks_of_a_real_run(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: dict[str, list[type]] = {}
    real_build = imgcls.run.train.build_trainer

    def build_trainer(cfg, plan, callbacks, loggers):  # noqa: ANN001, ANN202 - records, then builds for real
        built[str(cfg.get("mode"))] = [type(c) for c in callbacks]
        return real_build(cfg, plan, callbacks, loggers)

    monkeypatch.setattr(imgcls.run.train, "build_trainer", build_trainer)
    monkeypatch.setattr(imgcls.bench.training, "build_trainer", build_trainer)
    # No validation in either (a benchmark has none): otherwise best.ckpt's callback differs, and rightly.
    overrides = tiny_overrides(image_folder, "recipe.epochs=1", "trainer.max_steps=2", "trainer.limit_val_batches=0")
    run_train(compose_config(overrides, run_dir=tmp_path / "train"))
    bench = ["mode=benchmark", "benchmark.warmup=1", "benchmark.iterations=2"]
    run_train(compose_config([*overrides, *bench], run_dir=tmp_path / "bench"))
    # Less the checkpoint callbacks: no ckpt (conf/train.yaml), not even after the timed window.
    assert built["benchmark"] == [*(c for c in built["train"] if not issubclass(c, ModelCheckpoint)), BenchmarkTimer]
    assert len(built["train"]) >= 6 and any(issubclass(c, ModelCheckpoint) for c in built["train"])


@pytest.mark.slow
def test_train_benchmark_cli_on_synthetic_data_and_bad_batch_sizes(tmp_path: Path) -> None:
    train = [
        str(ROOT / "train.py"), "mode=benchmark", "model=resnet18", "data=synthetic", "data.num_classes=10",
        "data.batch_size=4", "recipe.global_batch_size=4", "model.image_size=32", "data.num_workers=0",
        "benchmark.warmup=1", "benchmark.iterations=3", "callbacks.progress_bar=none",
        "trainer.enable_progress_bar=false", f"hydra.run.dir={tmp_path / 'train'}",
    ]  # fmt: skip
    evaluate_py = [str(ROOT / "evaluate.py"), "mode=benchmark", "model=resnet18", f"hydra.run.dir={tmp_path}"]
    results = run_clis({"train": train, "empty": [*evaluate_py, "batch_sizes=[]"]})
    assert results["train"].returncode == 0, results["train"].stderr[-2000:]
    document = json.loads((tmp_path / "train" / "benchmark.json").read_text())
    assert document["data.backend"] == "synthetic" and document["iterations"] == 3
    assert_one_line_error(results["empty"], "batch_sizes=[] is empty")


def test_gpu_path_synchronises(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    from imgcls.bench import inference

    inference._sync(torch.device("cuda"))
    inference._sync(torch.device("cpu"))
    assert calls == [torch.device("cuda")]


def test_loader_benchmark_ratios_are_medians_of_per_repeat_ratios() -> None:
    from imgcls.bench.data import table

    # The machine's speed drifts 2x between repeats; within a repeat, dali_cpu is 2x torchvision.
    rates = {
        "decode": [(400.0, 400.0), (200.0, 200.0), (800.0, 800.0)],
        "torchvision": [(100.0, 100.0), (50.0, 50.0), (200.0, 200.0)],
        "dali_cpu": [(200.0, 220.0), (100.0, 100.0), (400.0, 380.0)],
    }
    out = table(rates, cores=2)
    row = next(line for line in out.splitlines() if line.startswith("| dali_cpu, default"))
    # wall: median 200 img/s, 2.00x torchvision in every repeat, 0.50x the decode ceiling
    assert row.split(" | ")[1:4] == ["200", "2.00x (2.00-2.00)", "0.50x (0.50-0.50)"]
    assert row.split(" | ")[5] == "2.00x (1.90-2.20)"  # CPU-time: per-repeat 2.2, 2.0, 1.9
    assert "Medians of 3 interleaved repeats" in out


@pytest.mark.slow
def test_loader_benchmark_runs_every_backend_on_real_jpegs(image_folder: Path) -> None:
    """Every row on the same files, with one-line errors for bad arguments."""

    def run_module(*argv: str) -> subprocess.CompletedProcess:
        return warm_python.run(["-m", *argv])

    ok = run_module("imgcls.bench.data", f"data.root={image_folder}", "seconds=0.2", "repeats=1", "batch_size=4")
    assert ok.returncode == 0, ok.stderr[-2000:]
    rows = [line.split(" | ")[0].lstrip("| ") for line in ok.stdout.splitlines() if line.startswith("| ")][1:]
    assert rows == [
        "decode ceiling (PIL/libjpeg-turbo full decode)", "torchvision DataLoader",
        "dali_cpu bare (full decode + RRC, NVIDIA)", "DALI ROI decode only (crop window, no resize)",
        "dali_cpu, DALI resize (dali_train_resize=dali)", "dali_cpu, default (auto: torch resize from 128 px)",
        "torchvision, WebDataset shards", "torchvision, TFRecord shards",
        "dali_cpu, WebDataset shards (fn.readers.webdataset)", "dali_cpu, TFRecord shards (fn.readers.tfrecord)",
    ]  # fmt: skip
    lines = [line for line in ok.stdout.splitlines() if line.startswith("| ")][1:]
    rates = [float(line.split(" | ")[1]) for line in lines]
    assert all(rate > 0 for rate in rates), ok.stdout  # the shard rows read images too
    bad = run_module("imgcls.bench.data", f"data.root={image_folder}", "backends=ffcv")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "imgcls: error: backends=ffcv: unknown ['ffcv']; allowed: decode, torchvision, dali_cpu_bare, "
        "dali_roi_decode, dali_cpu_dali_resize, dali_cpu, dali_cpu_sync, torchvision_webdataset, "
        "torchvision_tfrecord, dali_cpu_webdataset, dali_cpu_tfrecord"
    ]
