"""The dali_cpu / dali_gpu data backends: DALI pipelines behind the same loader interface as torchvision.

`DaliBackend.loader()` builds a pipeline (dali_pipelines.py) for one rank and wraps DALI's
`DALIGenericIterator` (or `DALIRaggedIterator` when the torch resize of dali_host.py takes the crops) in
`DaliLoader`, the thin Lightning adapter. The adapter is hand-written because
Lightning has no DALI integration (Lightning #791, won't fix) and DALI's iterator alone breaks under it:
- Lightning prefetches one batch ahead, so a batch must outlive the next iterator call. DALI's classic
  executor owned its output buffers until the next call (DALI PR #3239); with DALI 2's dynamic executor
  (the default; pyproject requires DALI >= 2.4) every batch gets its own buffer, kept alive by the
  DLPack tensor the plugin returns without copying. The adapter copies only under the classic executor:
  a 64x3x224x224 float copy costs about 0.5 ms an image on one core, a fifth of the whole CPU pipeline.
  test_dali.py checks that held batches stay intact.
- Lightning needs the length of this rank's epoch and a fresh epoch on every `iter()`; DALI's iterator
  warns and ignores a reset before its epoch ends (limit_*_batches): the adapter drains it first.
- The reader's label is the sample index (dali_pipelines.py); the adapter maps it to the class label
  from the same folder walk as torchvision's ImageFolder, so labels are identical by construction, and it
  can record which samples a rank read (data.trace_dir).
- Bad files are found as DALI reads them (dali_pipelines.check_encoded), not by opening every file before
  training: the adapter drops the flagged samples from their batch and applies data.on_bad_image, as the
  torchvision backend does with its workers' bad samples. On ImageNet, a scan before training cost minutes
  per rank at every start; see docs/data-backends.md "Startup".
"""

from __future__ import annotations

import functools
import math
import os
import queue
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from nvidia.dali.plugin.pytorch import DALIGenericIterator, DALIRaggedIterator, LastBatchPolicy
from torchvision.datasets.folder import IMG_EXTENSIONS

from imgcls.data.augment import parse_randaugment
from imgcls.data.bad_images import BadImageLog, BadSample, scan_file
from imgcls.data.dali_host import HostResize, resize_on_host
from imgcls.data.dali_pipelines import READER, interp_type, train_pipeline, val_pipeline
from imgcls.data.folder import check_same_classes, classes_of, split_dir
from imgcls.errors import ConfigError, DataError
from imgcls.seeding import dali_pipeline_seed


class FileList:
    """A split's files in ImageFolder's order (torchvision's make_dataset walk, reproduced), held compactly.

    ImageFolder keeps a (path, class) tuple per file, about 220 bytes each in Python objects (280 MB for
    ImageNet). Here: the paths relative to the split folder in one bytes object and the classes in one
    tensor, about 40 bytes a file, and the walk never holds more than one class folder's names at a time.
    DALI reads them from a list file (write_list), which costs it one copy of the names in C++; a Python
    list for `files=` cost 0.8 GB and 6 s more on ImageNet (argument copies in the pipeline's spec)."""

    def __init__(self, split_root: Path, classes: list[str]) -> None:
        self.root = str(split_root)
        root = os.fsencode(self.root)
        suffixes = tuple(os.fsencode(e) for e in IMG_EXTENSIONS)
        blob = bytearray()  # grown in place: no second copy of every name at its peak
        ends: list[np.ndarray] = []
        counts: list[int] = []
        for name in classes:
            names: list[bytes] = []
            # make_dataset: sorted(os.walk(class folder, followlinks=True)), sorted names, IMG_EXTENSIONS.
            for folder, _, files in sorted(os.walk(os.path.join(root, os.fsencode(name)), followlinks=True)):
                relative = os.path.relpath(folder, root)
                names.extend(os.path.join(relative, f) for f in sorted(files) if f.lower().endswith(suffixes))
            if not names:
                raise DataError(f"{os.path.join(self.root, name)} has no images ({', '.join(IMG_EXTENSIONS)})")
            counts.append(len(names))
            start = len(blob)
            blob += b"\0".join(names) + b"\0"
            ends.append(start + np.cumsum(np.fromiter(map(len, names), np.int64, len(names)) + 1))
        self._blob = blob
        self._ends = np.concatenate(ends)  # one past each name's separator
        self.targets = torch.repeat_interleave(torch.arange(len(classes)), torch.tensor(counts))

    def __len__(self) -> int:
        return len(self.targets)

    def relative(self, index: int) -> str:
        end = int(self._ends[index]) - 1
        start = int(self._ends[index - 1]) if index else 0
        return os.fsdecode(bytes(self._blob[start:end]))

    def path(self, index: int) -> str:
        return os.path.join(self.root, self.relative(index))

    def write_list(self, path: str, begin: int = 0, end: int | None = None) -> None:
        """DALI's `file_list` format, "relative/path label" a line, the label being the sample index; only
        the samples [begin, end) when given (their labels stay the indices in the whole split)."""
        if b"\n" in self._blob:
            raise DataError(f"{self.root} holds a file name with a line break, which DALI's file list cannot hold")
        end = len(self) if end is None else end
        with open(path, "wb") as out:
            chunk = 1 << 16
            for first in range(begin, end, chunk):
                last = min(first + chunk, end)
                start = int(self._ends[first - 1]) if first else 0
                names = bytes(self._blob[start : int(self._ends[last - 1]) - 1]).split(b"\0")
                out.write(b"".join(b"%s %d\n" % (n, first + i) for i, n in enumerate(names)))


class DaliBackend:
    """ImageFolder layout read by DALI. device="cpu" (dali_cpu) or "gpu" (dali_gpu: nvJPEG + GPU resize)."""

    def __init__(self, cfg: Any, device: str = "cpu") -> None:
        if device == "gpu" and not torch.cuda.is_available():
            raise ConfigError("data.backend=dali_gpu needs a CUDA GPU and this machine has none; use dali_cpu")
        self.cfg = cfg
        self.gpu = device == "gpu"
        interp_type(str(cfg.interpolation))  # fail early on an interpolation DALI lacks
        threads = cfg.get("dali_resize_threads")
        if threads is not None and (not isinstance(threads, int) or threads < 0):  # 0 or 1: one thread
            raise ConfigError(f"data.dali_resize_threads={threads} must be a whole number >= 0 (default: num_workers)")
        prefetch = cfg.get("dali_host_prefetch", 1)
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ConfigError(f"data.dali_host_prefetch={prefetch} must be a whole number >= 0 (0: no thread)")
        self.host_prefetch = prefetch
        self.classes = classes_of(cfg.root, "train")
        check_same_classes(self.classes, classes_of(cfg.root, "val"), cfg.root)
        self._files: dict[str, FileList] = {}
        self.bad_images = BadImageLog(str(cfg.get("on_bad_image") or "skip"))

    def files(self, split: str) -> FileList:
        """The split's files and classes in ImageFolder's order: the same walk, so the same labels. No file
        is opened here: bad files are found while DALI reads them (dali_pipelines.check_encoded)."""
        if split not in self._files:
            self._files[split] = FileList(split_dir(self.cfg.root, split), self.classes)
        return self._files[split]

    def loader(
        self,
        split: str,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        image_size: int | None = None,
        augment_magnitude: int | None = None,
        with_crop_shape: bool = False,
    ) -> DaliLoader:
        cfg = self.cfg
        files = self.files(split)
        if len(files) < world_size:
            raise DataError(f"{split_dir(cfg.root, split)} has {len(files)} images, fewer than {world_size} ranks")
        # DALI reads the list while the loader builds the pipeline; the file goes right after.
        listing = tempfile.NamedTemporaryFile(prefix="imgcls-dali-", suffix=".txt", delete=False)  # noqa: SIM115
        listing.close()
        try:
            if split == "train":
                # The whole list: DALI's random_shuffle permutes the whole list (a fixed seed) before it
                # takes a rank's shard, and moves each rank to the next shard every epoch
                # (stick_to_shard=False), so a rank's own files alone would read different samples.
                files.write_list(listing.name)
                shard = (rank, world_size)
            else:
                # Val reads its own contiguous shard in order every epoch (stick_to_shard, no shuffle):
                # DALI given only that shard reads the same samples, and holds 1/world_size of the names.
                files.write_list(listing.name, rank * len(files) // world_size, (rank + 1) * len(files) // world_size)
                shard = (0, 1)
            return self._loader(files, listing.name, split, batch_size, rank, world_size, seed, image_size,
                                augment_magnitude, with_crop_shape, shard)  # fmt: skip
        finally:
            os.unlink(listing.name)

    def _loader(
        self,
        files: FileList,
        file_list: str,
        split: str,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        image_size: int | None,
        augment_magnitude: int | None,
        with_crop_shape: bool,
        shard: tuple[int, int],
    ) -> DaliLoader:
        cfg = self.cfg
        size = int(image_size or cfg.image_size)
        training = split == "train"
        common = {
            "file_list": file_list,
            "file_root": files.root,
            "shard_id": shard[0],  # the reader's shard of the list file (loader)
            "num_shards": shard[1],
            "size": size,
            "gpu": self.gpu,
            "interpolation": str(cfg.interpolation),
            "mean": list(cfg.mean),
            "std": list(cfg.std),
            # channels_last: CMN writes HWC and the adapter returns an NCHW view with NHWC strides.
            "layout": "HWC" if cfg.get("channels_last") else "CHW",
            "fp16": bool(cfg.get("dali_fp16")),
            "batch_size": batch_size,
            "num_threads": max(1, int(cfg.num_workers)),
            # dali_cpu never touches CUDA (device_id=None), so it also runs on machines without a GPU.
            "device_id": torch.cuda.current_device() if self.gpu else None,
            "seed": dali_pipeline_seed(seed, rank),
            "prefetch_queue_depth": max(1, int(cfg.prefetch_factor or 2)),
        }
        host_resize: HostResize | None = None
        if training and resize_on_host(
            str(cfg.get("dali_train_resize") or "auto"), self.gpu, cfg.augment, str(cfg.interpolation), size
        ):
            host_resize = HostResize(
                size,
                str(cfg.interpolation),
                antialias=bool(cfg.get("dali_train_antialias")),
                mean=list(cfg.mean),
                std=list(cfg.std),
                fp16=common["fp16"],
                pin_memory=bool(cfg.get("pin_memory")),
                threads=cfg.get("dali_resize_threads") or 1,
            )
        if training:
            randaugment = parse_randaugment(str(cfg.randaugment)) if cfg.augment == "randaugment" else (2, 9)
            if augment_magnitude is not None:
                randaugment = (randaugment[0], int(augment_magnitude))
            pipe = train_pipeline(
                **common,
                crop_scale=list(cfg.train_crop_scale),
                crop_ratio=list(cfg.train_crop_ratio),
                hflip=float(cfg.hflip),
                antialias=bool(cfg.get("dali_train_antialias")),
                augment=cfg.augment,
                randaugment=randaugment,
                with_crop_shape=with_crop_shape,
                host_resize=host_resize is not None,
            )
        else:
            pipe = val_pipeline(**common, crop_pct=float(cfg.val_crop_pct))
        trace = Path(cfg.trace_dir) / f"{split}_rank{rank}" if cfg.get("trace_dir") else None
        outputs = ["data", "index", "bad"] + (["mirror"] if host_resize else [])
        outputs += ["crop_shape"] if with_crop_shape else []
        return DaliLoader(
            pipe,
            outputs,
            files,
            batch_size,
            rank,
            world_size,
            drop_last=training,
            trace=trace,
            channels_last=common["layout"] == "HWC",
            host_resize=host_resize,
            bad_images=self.bad_images,
            prefetch=self.host_prefetch,
        )


@dataclass
class _Batch:
    """One DALI batch, made ready in the producing thread; the policy and trace are applied by the consumer."""

    read: list[int]  # the reader's sample indices, bad files included (data.trace_dir)
    bad: torch.Tensor  # flagged sample indices (data.on_bad_image)
    result: tuple[torch.Tensor, ...] | None  # what the loader yields; None: nothing (all bad, or empty)


class _Worker:
    """The one thread that makes every call into a DALI iterator fed to HostResize (construction, batches,
    resets), so the iterator never changes threads; each call is a task, run in order.

    A daemon thread: a loader that is never closed (an abandoned iterator blocked on its queue) must not
    keep the process from exiting. The thread holds no reference to the loader between tasks, so a
    dropped loader is collected and its finalizer ends the thread."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.device = torch.cuda.current_device() if torch.cuda.is_available() else None
        self.thread = threading.Thread(
            target=_Worker._run, args=(self._tasks, self.device), name="imgcls-dali-host", daemon=True
        )
        self.thread.start()

    @staticmethod
    def _run(tasks: queue.SimpleQueue, device: int | None) -> None:
        if device is not None:  # pinned batches and the caching host allocator follow the rank's device
            torch.cuda.set_device(device)
        while (task := tasks.get()) is not None:
            call, future = task
            del task  # no reference to the loader while waiting for the next task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
                    future.set_exception(exc)
            del call, future

    def submit(self, call: Callable[[], Any]) -> Future:
        future: Future = Future()
        self._tasks.put((call, future))
        return future

    def call(self, call: Callable[[], Any]) -> Any:
        return self.submit(call).result()

    def close(self) -> None:
        self._tasks.put(None)


class DaliLoader:
    """One rank's epochs of (images, labels); train drops the last partial batch, val keeps it.

    With HostResize (dali_cpu's torch resize), batch N+1 is read from DALI and resized in a background
    thread (_Worker) while the consumer trains on batch N: the resize runs on the host, so without this a
    GPU would wait for it at every step. `prefetch` batches (default 1) wait in a bounded queue, plus the one
    being made. Errors reach the consumer at the batch where they happened; the policy for bad files, the
    trace and the epoch bookkeeping stay in the consumer, in order, so they are the same as without the
    thread (prefetch=0: everything in the consumer's thread, as dali's own resize does)."""

    def __init__(
        self,
        pipe: Any,
        outputs: list[str],
        files: FileList,
        batch_size: int,
        rank: int,
        world_size: int,
        drop_last: bool,
        trace: Path | None = None,
        channels_last: bool = False,
        host_resize: HostResize | None = None,
        bad_images: BadImageLog | None = None,
        prefetch: int = 1,
    ) -> None:
        self.channels_last = channels_last
        self.host_resize = host_resize
        self.files = files
        self.targets = files.targets
        self.bad_images = bad_images or BadImageLog("skip")
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.trace = trace
        self.epoch = 0
        total = len(files)
        # The reader's shard of this rank: [floor(r*N/W), floor((r+1)*N/W)), as DALI splits it.
        self.shard_size = (rank + 1) * total // world_size - rank * total // world_size
        if drop_last:
            # DROP: every rank takes the same number of steps (DDP would hang otherwise), as DALI counts them.
            self.length = (total // world_size) // batch_size
        else:
            self.length = math.ceil(self.shard_size / batch_size)
        if self.length == 0:
            raise DataError(f"{total} images over {world_size} rank(s) make no full batch of {batch_size}")
        policy = LastBatchPolicy.DROP if drop_last else LastBatchPolicy.PARTIAL
        self.prefetch = max(0, int(prefetch)) if host_resize is not None else 0
        self._worker = _Worker() if self.prefetch else None
        if self._worker is not None:
            weakref.finalize(self, self._worker.close)
        self._stop: threading.Event | None = None  # set to stop the running epoch's producer
        if host_resize is None:
            self._iterator = DALIGenericIterator(
                pipe, outputs, reader_name=READER, last_batch_policy=policy, auto_reset=False
            )
        else:  # the crops differ in size: a list of tensors, resized by HostResize
            types = [DALIRaggedIterator.SPARSE_LIST_TAG] + [DALIRaggedIterator.DENSE_TAG] * (len(outputs) - 1)
            make = functools.partial(
                DALIRaggedIterator, pipe, outputs, reader_name=READER, output_types=types,
                last_batch_policy=policy, auto_reset=False,
            )  # fmt: skip
            # Built on the worker too: the iterator runs its first batch in its constructor.
            self._iterator = self._worker.call(make) if self._worker is not None else make()
        self._consumed = 0  # DALI batches taken in the current epoch
        self.copy = not getattr(pipe, "exec_dynamic", False)

    def __len__(self) -> int:
        return self.length

    def _finish_epoch(self) -> None:
        # DALI cannot reset mid-epoch: run out the rest of an epoch that the consumer left early.
        if self._consumed:
            for _ in self._iterator:
                pass
            self._iterator.reset()
            self._consumed = 0
            self.epoch += 1

    def _record_bad(self, indices: torch.Tensor) -> None:
        """The policy for files the pipeline flagged; the reason is found again here (a bad file is rare)."""
        paths = [self.files.path(i) for i in indices.tolist()]
        self.bad_images.record([BadSample(p, scan_file(p) or "not decodable by DALI") for p in paths])

    def _prepare(self, out: dict[str, Any]) -> _Batch:
        """A DALI batch without its bad files, resized (HostResize) or laid out; no side effects."""
        index = out["index"].reshape(-1).long().cpu()
        read = index.tolist()
        if index.numel() == 0:  # PARTIAL can end a short shard with an empty batch
            return _Batch(read, index, None)
        images, mirror = out["data"], out.get("mirror")
        flags = out["bad"].reshape(-1).bool().cpu()
        bad = index[flags]
        if bad.numel():
            keep = ~flags
            index = index[keep]
            if isinstance(images, list):  # the ragged crops of the torch resize
                images = [image for image, k in zip(images, keep.tolist()) if k]
                mirror = mirror[keep]
            else:
                images = images[keep]  # a new tensor: no buffer shared with DALI
            out = {k: v[keep] if k == "crop_shape" else v for k, v in out.items()}
            # As the torchvision backend: an empty batch is not yielded, nor in training one left
            # with a single sample, which BatchNorm cannot normalize.
            if len(index) < (2 if self.drop_last else 1):
                return _Batch(read, bad, None)
        if self.host_resize is not None:  # writes a new batch: no buffer shared with DALI
            images = self.host_resize(images, mirror)
        elif self.channels_last:  # NHWC from CMN -> an NCHW view with channels_last strides
            images = images.permute(0, 3, 1, 2)
        if self.copy and self.host_resize is None:  # the classic executor reuses its buffers (docstring)
            images = images.clone()
        result: tuple[torch.Tensor, ...] = (images, self.targets[index])
        if "crop_shape" in out:
            result = (*result, out["crop_shape"].clone())
        return _Batch(read, bad, result)

    def _epoch(self) -> Iterator[_Batch]:
        """This epoch's batches, made in the consumer's thread."""
        for batch in self._iterator:
            self._consumed += 1
            yield self._prepare(batch[0])
        self._iterator.reset()
        self._consumed = 0
        self.epoch += 1

    def _produce(self, ready: queue.Queue, stop: threading.Event) -> None:
        """On the worker: this epoch's batches into READY, then ("end", None); an error as ("error", exc)."""

        def put(item: tuple[str, Any]) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False  # the consumer left: the rest of the epoch is run out by the next _finish_epoch

        try:
            for batch in self._iterator:
                self._consumed += 1
                if not put(("batch", self._prepare(batch[0]))):
                    return
            self._iterator.reset()
            self._consumed = 0
            self.epoch += 1
            put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - raised again in the consumer
            put(("error", exc))

    def _background_epoch(self, worker: _Worker) -> Iterator[_Batch]:
        """This epoch's batches, made by the worker up to `prefetch` + 1 ahead of the consumer."""
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = self._stop = threading.Event()
        worker.submit(functools.partial(self._produce, ready, stop))
        try:
            while True:
                kind, item = ready.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise item
                yield item
        finally:
            stop.set()  # also when the consumer stops early or the iterator is dropped

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        worker = self._worker
        if worker is not None:
            if self._stop is not None:
                self._stop.set()  # an earlier iterator's producer, left mid-epoch and not closed
            worker.call(self._finish_epoch)  # after that producer has returned: one task at a time
        else:
            self._finish_epoch()
        trace = None
        if self.trace is not None:
            self.trace.parent.mkdir(parents=True, exist_ok=True)
            trace = open(f"{self.trace}_epoch{self.epoch}.txt", "w")  # noqa: SIM115 - closed below
        try:
            for batch in self._background_epoch(worker) if worker is not None else self._epoch():
                if trace is not None:  # what the reader read, bad files included
                    trace.write(" ".join(map(str, batch.read)) + "\n")
                if batch.bad.numel():
                    self._record_bad(batch.bad)
                if batch.result is not None:
                    yield batch.result
        finally:
            if self._stop is not None:  # the consumer raised (e.g. data.on_bad_image=error) or left early
                self._stop.set()
            if trace is not None:
                trace.close()
