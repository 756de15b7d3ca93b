"""`python evaluate.py mode=benchmark ckpt=PATH | model=NAME batch_sizes=[1,2,...]` (NVIDIA benchmark_inference).

ckpt=MODEL.onnx (an fp32 or INT8 export of imgcls.export) is timed on onnxruntime's CPU provider, with as many
threads as torch uses here; the document's "backend" says which (torch | onnxruntime).

For each batch size: warm-up iterations (not timed), then timed forward passes on a fixed random batch of
the model's input size, under the precision's autocast and memory format, without gradients. The device
is synchronised before each timer start and stop on GPU (kernels are asynchronous there). Reported like
NVIDIA's inference tables: throughput img/s = batch / mean latency, latency avg / p90 / p95 / p99 in ms.
Hand-written because none of the libraries in use times per-batch latency percentiles (torch.utils.
benchmark reports means and medians of blocked runs, not per-iteration percentiles).
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from imgcls.config.checks import EVALUATE, check_config
from imgcls.config.compose import model_config, precision_config, required_ckpt
from imgcls.config.schema import ModelSchema
from imgcls.errors import ConfigError
from imgcls.inference.onnx_model import OnnxModel, is_onnx_path, load_onnx
from imgcls.inference.trained import load_trained
from imgcls.models.factory import build_network
from imgcls.storage import write_json_atomic
from imgcls.training.precision import set_tf32
from imgcls.typed_config import settings

COLUMNS = ("batch_size", "throughput_ips", "latency_avg_ms", "latency_p90_ms", "latency_p95_ms", "latency_p99_ms")
HEADERS = (
    "Batch size",
    "Throughput (img/s)",
    "Latency avg (ms)",
    "Latency p90 (ms)",
    "Latency p95 (ms)",
    "Latency p99 (ms)",
)


def check_batch_sizes(values: Any) -> list[int]:
    items = list(values) if isinstance(values, (list, tuple)) or OmegaConf.is_list(values) else [values]
    if not items:
        raise ConfigError("batch_sizes=[] is empty; give positive batch sizes, e.g. batch_sizes=[1,8,64]")
    sizes = []
    for item in items:
        try:
            size = int(item)
        except (TypeError, ValueError):
            size = 0
        if size <= 0 or str(item).strip() != str(size):
            raise ConfigError(f"batch_sizes={list(items)}: {item} is not a positive whole number")
        sizes.append(size)
    return sizes


def autocast_dtype(precision: Any, device: torch.device) -> torch.dtype | None:
    """None for fp32/tf32; bf16 for bf16, fp16 for amp on CUDA (bf16 on CPU, as training falls back)."""
    name = str(precision.lightning)
    if name == "bf16-mixed":
        return torch.bfloat16
    if name == "16-mixed":
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    net: nn.Module,
    batch_size: int,
    image_size: int,
    device: torch.device,
    dtype: torch.dtype | None = None,
    channels_last: bool = False,
    warmup: int = 5,
    iterations: int = 20,
    max_seconds: float | None = None,
) -> dict[str, float]:
    """One row of the table for a PyTorch network. Latency = one forward pass of the whole batch."""
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        return time_forward(lambda: net(images), batch_size, warmup, iterations, max_seconds, lambda: _sync(device))


def time_forward(
    forward: Callable[[], Any],
    batch_size: int,
    warmup: int = 5,
    iterations: int = 20,
    max_seconds: float | None = None,
    sync: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """The timing loop of every backend (torch: measure(); onnxruntime: measure_onnx()): `forward()` runs one
    batch of `batch_size` images; `sync()` waits for the device (asynchronous CUDA kernels) around each timer."""
    latencies: list[float] = []
    for _ in range(warmup):
        forward()
    started = time.perf_counter()
    for i in range(iterations):
        sync()
        start = time.perf_counter()
        forward()
        sync()
        latencies.append(time.perf_counter() - start)
        if max_seconds is not None and i >= 2 and time.perf_counter() - started > max_seconds:
            break
    ms = np.asarray(latencies) * 1000
    # NVIDIA's percentiles use numpy's "nearest" method (IC/logger.py); with few samples p99 is the maximum.
    return {
        "batch_size": batch_size,
        "throughput_ips": batch_size / (ms.mean() / 1000),
        "latency_avg_ms": float(ms.mean()),
        "latency_p90_ms": float(np.percentile(ms, 90, method="nearest")),
        "latency_p95_ms": float(np.percentile(ms, 95, method="nearest")),
        "latency_p99_ms": float(np.percentile(ms, 99, method="nearest")),
        "iterations": len(latencies),
    }


def measure_onnx(
    model: OnnxModel,
    batch_size: int,
    image_size: int,
    warmup: int = 5,
    iterations: int = 20,
    max_seconds: float | None = None,
) -> dict[str, float]:
    """One row of the table for an ONNX model on onnxruntime's CPU provider (fp32 or INT8 Q/DQ)."""
    images = np.random.default_rng(0).standard_normal((batch_size, 3, image_size, image_size), dtype=np.float32)
    return time_forward(lambda: model.run(images), batch_size, warmup, iterations, max_seconds)


def markdown_table(rows: list[dict[str, float]]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---:|" * len(HEADERS)]
    for row in rows:
        cells = [str(int(row["batch_size"])), f"{row['throughput_ips']:.1f}"]
        cells += [f"{row[c]:.2f}" for c in COLUMNS[2:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu_name() -> str:
    """lscpu's "Model name" (what the docs label tables with), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _network(cfg: DictConfig) -> tuple[nn.Module, str, int, Any]:
    """(net, arch, image size, precision config) from ckpt=, else model=NAME with random weights."""
    model_cfg = model_config(cfg)
    if model_cfg is not None and required_ckpt(cfg, needed=False) is None:
        precision = precision_config(cfg)
        net = build_network(settings(ModelSchema, {**model_cfg, "weights": None}), 1000)
        return net.eval(), model_cfg["arch"], int(model_cfg["image_size"]), precision
    trained = load_trained(required_ckpt(cfg), bool(cfg.use_ema), model_cfg=model_cfg)
    precision = precision_config(cfg, trained.precision)
    return trained.net, trained.arch, int(trained.preprocessing.get("image_size") or 224), precision


def run(cfg: DictConfig) -> dict[str, Any]:
    check_config(cfg, EVALUATE)
    sizes = check_batch_sizes(cfg.batch_sizes)
    bench = cfg.get("benchmark") or {}
    warmup, iterations = int(bench.get("warmup", 5)), int(bench.get("iterations", 20))
    if cfg.get("ckpt") and is_onnx_path(str(cfg.ckpt)):
        return _run_onnx(cfg, sizes, warmup, iterations, bench)
    net, arch, image_size, precision = _network(cfg)
    tf32 = bool(precision.get("tf32", False))
    set_tf32(tf32)  # as training does: precision=fp32 must not time TF32 convolutions on Ampere+
    image_size = int(bench.get("image_size") or image_size)
    accelerator = str(cfg.trainer.accelerator)
    use_cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    channels_last = bool(precision.channels_last)
    net = net.to(device).float().eval()
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    dtype = autocast_dtype(precision, device)
    rows = []
    for size in sizes:
        rows.append(
            measure(net, size, image_size, device, dtype, channels_last, warmup, iterations, bench.get("max_seconds"))
        )
        print(f"batch {size}: {rows[-1]['throughput_ips']:.1f} img/s", flush=True)
    document = {
        "mode": "benchmark_inference",
        "backend": "torch",
        "model": arch,
        "ckpt": cfg.get("ckpt"),
        "precision": str(precision.name),
        "autocast": str(dtype).replace("torch.", "") if dtype else None,
        "channels_last": channels_last,
        "tf32": tf32,
        "image_size": image_size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "threads": torch.get_num_threads(),
        "warmup": warmup,
        "iterations": iterations,
        "torch": torch.__version__,
        "rows": rows,
    }
    return _report(cfg, document)


def _report(cfg: DictConfig, document: dict[str, Any]) -> dict[str, Any]:
    output = Path(cfg.output) if cfg.get("output") else Path(cfg.run_dir) / "benchmark.json"
    write_json_atomic(output, document)
    print(markdown_table(document["rows"]))
    print(json.dumps(document))
    return document


def _run_onnx(cfg: DictConfig, sizes: list[int], warmup: int, iterations: int, bench: Any) -> dict[str, Any]:
    """ckpt=MODEL.onnx: the rows on onnxruntime's CPU provider with as many intra-op threads as torch uses,
    so that the torch and onnxruntime rows of one machine compare the same cores."""
    for key in ("model", "precision"):
        if cfg.get(key) is not None:
            raise ConfigError(f"{key}= does not apply to an ONNX file (ckpt={cfg.ckpt}): it runs the graph it holds")
    if str(cfg.trainer.accelerator) in ("gpu", "cuda"):
        raise ConfigError("ckpt=*.onnx is timed on onnxruntime's CPU provider; use trainer.accelerator=cpu or auto")
    threads = torch.get_num_threads()
    model = load_onnx(str(cfg.ckpt), threads=threads)
    image_size = int(bench.get("image_size") or model.image_size)
    rows = []
    for size in sizes:
        rows.append(measure_onnx(model, size, image_size, warmup, iterations, bench.get("max_seconds")))
        print(f"batch {size}: {rows[-1]['throughput_ips']:.1f} img/s", flush=True)
    import onnxruntime

    document = {
        "mode": "benchmark_inference",
        "backend": "onnxruntime",
        "model": model.arch,
        "ckpt": str(cfg.ckpt),
        "precision": model.precision,
        "quantization": model.quantization,
        "image_size": image_size,
        "device": cpu_name(),
        "threads": threads,
        "warmup": warmup,
        "iterations": iterations,
        "onnxruntime": onnxruntime.__version__,
        "rows": rows,
    }
    return _report(cfg, document)
