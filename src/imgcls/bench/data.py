"""`python -m imgcls.bench.data data.root=DIR [cores=2] [image_size=224] ...`: input-pipeline throughput.

Times the train pipeline (decode, random-resized crop, flip, normalize) of each data backend on the same
JPEG files and the same CPU cores (the process and its workers are pinned to the first `cores` cores),
next to the decode-only ceiling: a plain libjpeg-turbo full decode of the same files (PIL, one process
per core). Prints one table of images/s with ratios to torchvision and to that ceiling, measured two
ways: wall-clock images/s and images per CPU-second times the cores (see cpu_seconds).

Every repeat times all rows back to back, for a few seconds each. The table gives the median rate of
each row and, for the ratios, the median of the per-repeat ratios: a virtual machine's speed drifts by
tens of percent over minutes (other tenants), and rows measured seconds apart see the same speed, so
their ratio is stable where best-of or mean rates across minutes are not.

Rows:
- decode ceiling: PIL `Image.open().convert("RGB")`, full decode, `cores` processes.
- torchvision: this project's torchvision backend (ImageFolder + timm transforms, DataLoader with
  `cores` workers, 1 torch thread each).
- dali_cpu bare: NVIDIA's PyTorch DALI train pipeline (full decode, random_resized_crop, CMN), for
  reference; not a backend of this project.
- DALI ROI decode: `fn.decoders.image_random_crop` alone: what decoding only the crop window costs.
- dali_cpu, DALI resize: this backend with data.dali_train_resize=dali (ROI decode, fn.resize, CMN).
- dali_cpu: this backend as configured by default (ROI decode in DALI, resize/flip/normalize in torch:
  data/dali/host_resize.py, in a background thread that makes the next batch while the consumer works).
- dali_cpu, resize in the step: the same with data.dali_host_prefetch=0 (the torch resize runs in the
  consumer's thread, when it asks for a batch).
- torchvision / dali_cpu from WebDataset or TFRecord shards: the same files converted first (data/shards/convert.py,
  `shard_size` images a shard) and read with data.format=webdataset|tfrecord: a shard is one sequential read
  instead of one open per file (docs/shards.md).

compute_ms=S: the consumer sleeps S ms after each batch, as a training process waits for its GPU step (a
sleep holds no core and no GIL, like a CUDA synchronisation). Then the table also gives each row's time per
batch and, for the dali_cpu rows, the time its torch resize took per batch: with the resize in a background
thread a batch should take about max(resize, S, DALI's decode), without it about resize + S.

Arguments (key=value): data.root (ROOT/train/<class>/*.jpg, or any folder of class folders of JPEGs such
as imagenet-samples/<wnid>/*.JPEG), cores (2), image_size (224), batch_size (64), images (all: at most
this many files, spread over the classes), seconds (3: timed seconds per row and repeat), repeats (7),
backends (all but dali_cpu_sync), compute_ms (0), shard_size (256: images per shard of the shard rows).
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from imgcls.errors import ConfigError, UserError

DEFAULTS: dict[str, Any] = {
    "data.root": None,
    "cores": 2,
    "image_size": 224,
    "batch_size": 64,
    "images": None,
    "seconds": 3.0,
    "repeats": 7,
    "backends": "decode,torchvision,dali_cpu_bare,dali_roi_decode,dali_cpu_dali_resize,dali_cpu,"
    "torchvision_webdataset,torchvision_tfrecord,dali_cpu_webdataset,dali_cpu_tfrecord",
    "compute_ms": 0.0,
    "shard_size": 256,
}
SHARD_FORMATS = ("webdataset", "tfrecord")
ROWS = {
    "decode": "decode ceiling (PIL/libjpeg-turbo full decode)",
    "torchvision": "torchvision DataLoader",
    "dali_cpu_bare": "dali_cpu bare (full decode + RRC, NVIDIA)",
    "dali_roi_decode": "DALI ROI decode only (crop window, no resize)",
    "dali_cpu_dali_resize": "dali_cpu, DALI resize (dali_train_resize=dali)",
    "dali_cpu": "dali_cpu, default (auto: torch resize from 128 px)",
    "dali_cpu_sync": "dali_cpu, torch resize in the step (dali_host_prefetch=0)",
    "torchvision_webdataset": "torchvision, WebDataset shards",
    "torchvision_tfrecord": "torchvision, TFRecord shards",
    "dali_cpu_webdataset": "dali_cpu, WebDataset shards (fn.readers.webdataset)",
    "dali_cpu_tfrecord": "dali_cpu, TFRecord shards (fn.readers.tfrecord)",
}


def parse_args(argv: list[str]) -> dict[str, Any]:
    args = dict(DEFAULTS)
    for item in argv:
        key, sep, value = item.partition("=")
        if not sep or key not in DEFAULTS:
            raise ConfigError(f"unknown argument {item!r}; allowed: {', '.join(k + '=...' for k in DEFAULTS)}")
        args[key] = value
    if not args["data.root"]:
        raise ConfigError("data.root is not set; pass data.root=/path/to/jpegs (class folders of JPEG files)")
    for key in ("cores", "image_size", "batch_size", "repeats", "shard_size") + (("images",) if args["images"] else ()):
        args[key] = int(args[key])
    args["seconds"] = float(args["seconds"])
    args["compute_ms"] = float(args["compute_ms"])
    if args["compute_ms"] < 0:
        raise ConfigError(f"compute_ms={args['compute_ms']} must be >= 0")
    unknown = set(args["backends"].split(",")) - set(ROWS)
    if unknown:
        raise ConfigError(f"backends={args['backends']}: unknown {sorted(unknown)}; allowed: {', '.join(ROWS)}")
    if not 1 <= args["cores"] <= len(os.sched_getaffinity(0)):
        raise ConfigError(f"cores={args['cores']} must be between 1 and this machine's {len(os.sched_getaffinity(0))}")
    return args


def class_folders(root: Path) -> Path:
    """ROOT/train when it exists (an ImageFolder dataset), else ROOT itself (class folders of JPEGs)."""
    root = Path(root).expanduser()
    if (root / "train").is_dir():
        root = root / "train"
    if not root.is_dir() or not any(p.is_dir() for p in root.iterdir()):
        raise ConfigError(f"data.root={root} has no class folders of JPEG files")
    return root


def link_dataset(source: Path, limit: int | None, workdir: Path) -> tuple[Path, list[Path]]:
    """WORKDIR/{train,val}/<class>/ symlinks to at most LIMIT files of SOURCE, spread over the classes,
    so that every backend reads the very same files through its normal ImageFolder path."""
    files = sorted(p for p in source.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    if not files:
        raise ConfigError(f"data.root={source} has no .jpg/.jpeg files")
    if limit and limit < len(files):
        files = [files[i * len(files) // limit] for i in range(limit)]
    for split in ("train", "val"):
        for f in files:
            link = workdir / split / f.parent.name / f.name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(f.resolve())
    return workdir, files


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its live descendants (DataLoader / pool workers).

    The second measure of every row: images per CPU-second, times the cores, is what the pipeline would
    deliver with the cores to itself. On a shared machine wall-clock rates move with other people's jobs.
    """
    pids, seen = [os.getpid()], set()
    total = 0
    while pids:
        pid = pids.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14 and 15)
            for task in Path(f"/proc/{pid}/task").iterdir():
                pids += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue  # a worker that just exited
    return total / os.sysconf("SC_CLK_TCK")


def _decode(paths: list[Path]) -> int:
    from PIL import Image

    for path in paths:
        with Image.open(path) as image:
            image.convert("RGB")
    return len(paths)


Rate = tuple[float, float]  # (images per wall second, images per CPU-second x cores)


def bench_decode(files: list[Path], cores: int, seconds: float) -> Rate:
    with ProcessPoolExecutor(cores) as pool:
        list(pool.map(_decode, [files[i :: cores * 4][:8] for i in range(cores)]))  # start the workers
        chunks = [files[i :: cores * 4] for i in range(cores * 4)]
        count, start, cpu = 0, time.perf_counter(), cpu_seconds()
        while time.perf_counter() - start < seconds:
            count += sum(pool.map(_decode, chunks))
        return count / (time.perf_counter() - start), count / (cpu_seconds() - cpu) * cores


def time_batches(
    batches: Callable[[], Iterable[Any]], seconds: float, cores: int, warmup: int = 3, compute_ms: float = 0.0
) -> Rate:
    """Images/s over passes of the loader until SECONDS have passed (after WARMUP batches); the consumer
    sleeps COMPUTE_MS after each batch (a simulated training step)."""
    count, start, cpu = 0, None, 0.0
    while start is None or time.perf_counter() - start < seconds:
        for images, *_ in batches():
            if compute_ms:
                time.sleep(compute_ms / 1000)
            if start is None:
                warmup -= 1
                if warmup <= 0:
                    start, cpu = time.perf_counter(), cpu_seconds()
                continue
            count += len(images)
            if time.perf_counter() - start >= seconds:
                break
    return count / (time.perf_counter() - start), count / (cpu_seconds() - cpu) * cores


def data_config(root: Path, args: dict[str, Any], backend: str, *extra: str) -> Any:
    from hydra import compose, initialize_config_dir

    from imgcls.config.compose import CONF_DIR

    overrides = [
        "data=folder", f"data.root={root}", f"data.backend={backend}", f"model.image_size={args['image_size']}",
        f"data.num_workers={args['cores']}", "data.pin_memory=false", "hardware=cpu", "model=resnet50", *extra,
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides).data


def bare_dali(files: list[Path], args: dict[str, Any], roi_decode_only: bool = False) -> Any:
    """NVIDIA's HybridTrainPipe on CPU (IC/dataloaders.py, in the fn API): full decode, then crop.
    roi_decode_only: only `fn.decoders.image_random_crop` (crops of varying size, not resized)."""
    from nvidia.dali import fn, pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, DALIRaggedIterator, LastBatchPolicy
    from nvidia.dali.types import DALIDataType, DALIImageType

    @pipeline_def
    def pipe() -> Any:
        jpegs, labels = fn.readers.file(files=[str(f) for f in files], random_shuffle=True, name="Reader")
        if roi_decode_only:
            return fn.decoders.image_random_crop(
                jpegs, device="cpu", output_type=DALIImageType.RGB, num_attempts=100
            ), labels
        images = fn.decoders.image(jpegs, device="cpu", output_type=DALIImageType.RGB)
        size = args["image_size"]
        images = fn.random_resized_crop(
            images, size=[size, size], random_area=[0.08, 1.0], random_aspect_ratio=[0.75, 4 / 3], num_attempts=100,
            antialias=False,
        )  # fmt: skip
        mean, std = [0.485 * 255, 0.456 * 255, 0.406 * 255], [0.229 * 255, 0.224 * 255, 0.225 * 255]
        images = fn.crop_mirror_normalize(
            images,
            dtype=DALIDataType.FLOAT,
            output_layout="CHW",
            mean=mean,
            std=std,
            mirror=fn.random.coin_flip(),
        )
        return images, labels

    built = pipe(batch_size=args["batch_size"], num_threads=args["cores"], device_id=None, seed=1)
    common: dict[str, Any] = {"reader_name": "Reader", "last_batch_policy": LastBatchPolicy.DROP, "auto_reset": True}
    iterator: DALIGenericIterator | DALIRaggedIterator
    if roi_decode_only:  # crops of different sizes: a list of tensors per batch
        ragged = [DALIRaggedIterator.SPARSE_LIST_TAG, DALIRaggedIterator.DENSE_TAG]
        iterator = DALIRaggedIterator(built, ["data", "label"], output_types=ragged, **common)
    else:
        iterator = DALIGenericIterator(built, ["data", "label"], **common)
    return lambda: ((batch[0]["data"],) for batch in iterator)


class TimedResize:
    """A HostResize that adds up the seconds it spends (in whichever thread calls it)."""

    def __init__(self, resize: Any) -> None:
        self.resize, self.seconds, self.calls = resize, 0.0, 0

    def __call__(self, *args: Any) -> Any:
        start = time.perf_counter()
        out = self.resize(*args)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out


RESIZES: dict[str, TimedResize] = {}  # row -> its timed torch resize


def backend_rows(root: Path, args: dict[str, Any], backend: str, *extra: str, row: str | None = None) -> Any:
    """One of this project's backends, as configured by `data=folder` plus EXTRA overrides."""
    from imgcls.data.backends import make_backend
    from imgcls.data.protocol import LoaderSpec

    loader = make_backend(data_config(root, args, backend, *extra)).loader(LoaderSpec("train", args["batch_size"]))
    if row:  # a dali_cpu row: its torch resize is timed
        from imgcls.data.dali.loader import DaliLoader

        if isinstance(loader, DaliLoader) and loader.host_resize is not None:
            loader.host_resize = RESIZES[row] = TimedResize(loader.host_resize)
    return lambda: loader


def shard_dataset(root: Path, fmt: str, shard_size: int, dst: Path) -> Path:
    """ROOT's files (every row reads the same ones) converted to FMT shards in DST."""
    from imgcls.data.shards.convert import convert

    convert(root, dst, fmt, shard_size, progress=False)
    return dst


def run(args: dict[str, Any]) -> dict[str, list[Rate]]:
    import torch

    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args["cores"]]))  # children inherit it
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="imgcls-bench-") as tmp:
        root, files = link_dataset(class_folders(args["data.root"]), args["images"], Path(tmp))
        print(f"{len(files)} JPEG files from {args['data.root']}, {args['cores']} cores, {args['image_size']} px")
        makers: dict[str, Callable[[], Any]] = {
            "torchvision": lambda: backend_rows(root, args, "torchvision"),
            "dali_cpu_bare": lambda: bare_dali(files, args),
            "dali_roi_decode": lambda: bare_dali(files, args, roi_decode_only=True),
            "dali_cpu_dali_resize": lambda: backend_rows(root, args, "dali_cpu", "data.dali_train_resize=dali"),
            "dali_cpu": lambda: backend_rows(root, args, "dali_cpu", row="dali_cpu"),
            "dali_cpu_sync": lambda: backend_rows(
                root, args, "dali_cpu", "data.dali_host_prefetch=0", row="dali_cpu_sync"
            ),
        }
        chosen = args["backends"].split(",")
        for fmt in SHARD_FORMATS:
            if any(row.endswith("_" + fmt) for row in chosen):
                shards = shard_dataset(root, fmt, args["shard_size"], Path(tmp) / fmt)
                for backend in ("torchvision", "dali_cpu"):
                    makers[f"{backend}_{fmt}"] = functools.partial(
                        backend_rows, shards, args, backend, f"data.format={fmt}", f"data.shard_cache={tmp}/cache"
                    )
        loaders = {name: make() for name, make in makers.items() if name in chosen}
        rates: dict[str, list[Rate]] = {}
        for repeat in range(args["repeats"]):  # rows interleaved, so that background load hits them alike
            if "decode" in chosen:
                rates.setdefault("decode", []).append(bench_decode(files, args["cores"], args["seconds"]))
            for name, batches in loaders.items():
                rate = time_batches(batches, args["seconds"], args["cores"], compute_ms=args["compute_ms"])
                rates.setdefault(name, []).append(rate)
            summary = ", ".join(f"{k} {r[-1][0]:.0f} ({r[-1][1]:.0f}/cpu)" for k, r in rates.items())
            print(f"repeat {repeat + 1}: {summary}", flush=True)
        return {name: rates[name] for name in ROWS if name in rates}


def table(rates: dict[str, list[Rate]], cores: int) -> str:
    """Both measures: the median rate of each row, and the medians of its per-repeat ratios to torchvision
    and to the decode ceiling (with their range over the repeats)."""

    def ratio(name: str, ref: str, i: int) -> str:
        if ref not in rates:
            return "-"
        per_repeat = [a[i] / b[i] for a, b in zip(rates[name], rates[ref], strict=True)]
        if name == ref:
            return "1.00x"
        return f"{statistics.median(per_repeat):.2f}x ({min(per_repeat):.2f}-{max(per_repeat):.2f})"

    lines = [
        f"| pipeline | img/s (wall) | vs torchvision | vs decode ceiling | img/CPU-s x {cores} | vs torchvision "
        "| vs decode ceiling |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in rates:
        cells = [ROWS[name]]
        for i in (0, 1):
            cells.append(f"{statistics.median(r[i] for r in rates[name]):.0f}")
            cells += [ratio(name, "torchvision", i), ratio(name, "decode", i)]
        lines.append("| " + " | ".join(cells) + " |")
    repeats = len(next(iter(rates.values())))
    lines.append(f"\nMedians of {repeats} interleaved repeats; in brackets, the range of the per-repeat ratios.")
    return "\n".join(lines)


def step_times(rates: dict[str, list[Rate]], args: dict[str, Any]) -> str:
    """Per row: wall ms per batch (median), and the torch resize's ms per batch where it has one."""
    lines = [f"\nms per batch of {args['batch_size']}, consumer sleeping {args['compute_ms']:g} ms per batch:"]
    for name, row in rates.items():
        line = f"- {ROWS[name]}: {args['batch_size'] / statistics.median(r[0] for r in row) * 1000:.1f} ms"
        resize = RESIZES.get(name)
        if resize is not None and resize.calls:
            line += f" (its torch resize: {resize.seconds / resize.calls * 1000:.1f} ms a batch)"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        rates = run(args)
        print(table(rates, args["cores"]))
        print(step_times(rates, args))
    except UserError as exc:
        print(f"imgcls: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
