"""DaliLoader: one rank's epochs of DALI batches behind the loader interface Lightning expects (why it is
hand-written: backend.py), with dali_cpu's torch resize made ahead in a background thread (thread_executor.py)
into a ring of batch buffers whose size the loader's queue defines (ring_slots)."""

from __future__ import annotations

import functools
import math
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from nvidia.dali.plugin.pytorch import DALIGenericIterator, DALIRaggedIterator, LastBatchPolicy

from imgcls.data.bad_images import BadImageLog, BadSample, equal_step_counts
from imgcls.data.dali.host_resize import HostResize
from imgcls.data.dali.pipelines import READER
from imgcls.data.dali.settings import DaliSettings
from imgcls.data.dali.thread_executor import OneThreadExecutor
from imgcls.data.protocol import LoaderSpec
from imgcls.distributed import gather_objects
from imgcls.errors import DataError

# Pipelines whose executor would not stop (shut_down): kept for the life of the process, never destroyed.
_UNSTOPPABLE: list[Any] = []


def shut_down(pipe: Any) -> None:
    """Stop PIPE's executor now: DALI's own shutdown, which waits for the batches in flight with the GIL
    released. Hand-written because DALI does this only in Pipeline.__del__, wherever the last reference goes,
    and when that Shutdown raises (a batch that failed after the consumer stopped taking them) __del__ leaves
    the backend pipeline alive; when it is freed later, its destructor joins the executor while holding the
    GIL, and an fn.python_function in flight (the bad-image check) waits for the GIL forever (DALI PR 4965:
    the executor must be shut down with the GIL released). One retry; a pipeline that still refuses is kept,
    not freed: a leak instead of a hung process."""
    for _ in range(2):
        if getattr(pipe, "_pipe", None) is None:
            return
        try:
            pipe._shutdown()
            return
        except Exception:  # noqa: BLE001, S110 - its traceback would keep the pipeline alive; the try again is the handling
            pass
    _UNSTOPPABLE.append(pipe)


_reaper: OneThreadExecutor | None = None
_reaper_lock = threading.Lock()


def _release(pipes: list[Any], worker: OneThreadExecutor | None) -> Future:
    """A loader's end (DaliLoader.close, or its finalizer): its pipeline (PIPES' one) shut down in a thread of
    imgcls's, never in the caller's. A finalizer runs in whatever thread the garbage collector runs in, DALI's
    executor threads included (they run the bad-image check's Python), and an executor thread that shuts down its
    own pipeline joins itself (std::terminate: "Resource deadlock avoided"). The loader's worker, after the
    producer has returned; without one, a shared thread."""
    global _reaper
    if worker is None:
        with _reaper_lock:
            if _reaper is None:
                _reaper = OneThreadExecutor("imgcls-dali-shutdown")
        return _reaper.submit(functools.partial(shut_down, pipes[0]))
    future = worker.submit(functools.partial(shut_down, pipes[0]))
    worker.close()
    return future


def reader_error(exc: BaseException) -> BaseException:
    """A DALI operator's failure (an unreadable file, a truncated TFRecord, a tar sample without its label)
    as one DataError line: DALI's text after "encountered:" (the file named, as DALI names it), without
    the pipeline's traceback and C++ context around it. Anything else is returned as it is."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or "encountered:" not in text:
        return exc
    reason = text.split("encountered:", 1)[1].split("C++ context:", 1)[0]
    reason = " ".join(reason.split()).removeprefix("Assert on ").strip()
    if "same dimensionality" in reason:  # the only variable-length features read are TF1's object boxes
        reason += (
            " (some records have image/object/bbox/* lists and some none: with data.train_crop_object_boxes=true "
            "every record needs them, empty where it has no box, as TF1's build_imagenet_data.py writes them)"
        )
    return DataError(f"DALI could not read the data: {reason}")


class Catalog(Protocol):
    """What the loader needs of a split's samples (file_list.FileList for a folder, records.ShardCatalog for
    shard files): their number and, from the pipeline's keys, labels, bad-sample names and trace lines."""

    def __len__(self) -> int: ...

    def labels(self, keys: torch.Tensor) -> torch.Tensor: ...

    def bad_samples(self, keys: torch.Tensor) -> list[BadSample]: ...

    def trace_tokens(self, keys: torch.Tensor) -> list[str]: ...


@dataclass
class _Batch:
    """One DALI batch, made ready in the producing thread; the policy and trace are applied by the consumer."""

    read: torch.Tensor  # the keys of every sample the reader read, bad files included (data.trace_dir)
    bad: torch.Tensor  # the keys of the flagged samples (data.on_bad_image)
    # What the loader yields (with a copier: its staged copy, which the consumer hands over); None: nothing (all
    # bad, or empty).
    result: Any
    # Where it came from, for a resume at this batch (DaliLoader.position): the reader position from which the
    # pipeline makes this batch again (None: the pipeline saves no reader position), the loader's epoch, the DALI
    # batches taken before it in that epoch, and the repeats owed to it for unusable batches before it.
    start: str | None = None
    epoch: int = 0
    consumed: int = 0
    owed: int = 0


# How long a batch of the torch resize stays intact: the invariant behind HostResize's ring of batch buffers
# (batch_ring.py), which writes the k-th batch into slot k % slots whoever still holds the batch written there
# `slots` batches before.
# - The consumer, when it asks for the next batch, still uses at most CONSUMER_HOLDS earlier ones. Lightning's fit
#   loop asks for batch N+1 after training step N, or, when it prefetches (only for an unsized loader; this one
#   is sized), before step N while holding batch N; either way it is done with batch N-1 (its backward has run,
#   its copy to a GPU has read the host memory). The generator's own reference is to that same last batch.
# - prefetch > 0: the producer writes batch b only after the queue (maxsize prefetch) took batch b-1, so after
#   the consumer took batch b-1-prefetch. Alive then: b (being written), at most `prefetch` in the queue, the
#   one the consumer took last, and the CONSUMER_HOLDS before it: prefetch + 2 + CONSUMER_HOLDS.
# - prefetch = 0: batch b is written in the consumer's own call for it. Alive: b and the CONSUMER_HOLDS before it.
# A batch left empty (all its files bad) takes no slot and is not yielded: it can only shorten this.
# A consumer that keeps batches longer (a list of an epoch's batches) must clone them.
CONSUMER_HOLDS = 1


def ring_slots(prefetch: int) -> int:
    """The batch buffers a loader with `prefetch` queued batches needs, so that no batch still alive is
    overwritten (see above)."""
    return CONSUMER_HOLDS + 1 + (prefetch + 1 if prefetch > 0 else 0)


class DaliLoader:
    """One rank's epochs of (images, labels); train drops the last partial batch, val keeps it.

    With HostResize (dali_cpu's torch resize), batch N+1 is read from DALI and resized in a background
    thread (OneThreadExecutor) while the consumer trains on batch N: the resize runs on the host, so without this a
    GPU would wait for it at every step. `prefetch` batches (default 1) wait in a bounded queue, plus the one
    being made. Errors reach the consumer at the batch where they happened; the policy for bad files, the
    trace and the epoch bookkeeping stay in the consumer, in order, so they are the same as without the
    thread (prefetch=0: everything in the consumer's thread, as dali's own resize does).

    A batch of the torch resize is written into HostResize's ring of buffers: it stays intact while the consumer
    asks for CONSUMER_HOLDS more batches, not longer (ring_slots); DALI's own outputs are not reused.

    With a `copier` (a CUDA training device: device_prefetch.CudaCopies), each batch's host tensors are staged
    (their copy to the device queued on a side stream) in the thread that made the batch, the producer's with
    the torch resize, as soon as it exists, and handed over (the compute stream waits for that copy only) when
    the consumer is given the batch. The batch keeps its place in the epoch: staging moves no position, trace
    line or bad-file record ahead of the batch the consumer has."""

    def __init__(
        self,
        pipe: Any,
        outputs: list[str],
        files: Catalog,
        spec: LoaderSpec,
        settings: DaliSettings,
        host_resize: HostResize | None = None,
        bad_images: BadImageLog | None = None,
        signature: tuple = (),
        first_epoch: int = 0,
        restored: dict[str, Any] | None = None,
        rebuild: Callable[[int], Any] | None = None,
        copier: Any = None,
    ) -> None:
        """`spec`: the split, batch, rank and world size this loader serves, and the trainer's limit_batches
        (position's end of an epoch). `settings`: channels_last, host_prefetch, reader_positions (the train pipeline
        saves its reader's position, DALI's enable_checkpointing, so position() can say where the trainer is) and
        trace_dir. `signature`: what the pipeline's graph depends on, kept in each position (the backend builds
        a loader at a saved position only for the same signature). `first_epoch`: the epoch `pipe`'s list order
        and seed derive from (DaliBackend.loader), kept in each position too: a loader built at the position must
        read the same order. `restored`: the position `pipe` was built at from its reader position
        (DaliBackend._start). `rebuild(epoch)`: a new pipeline like `pipe`, built fresh for that epoch (its list
        order and seed), for the epoch after one the consumer left early (_finish_epoch). `copier`: stage() and
        hand_over() of device_prefetch.CudaCopies (None: the batches stay where DALI or the resize made them); set
        it before iterating."""
        batch_size, rank, world_size = spec.batch_size, spec.rank, spec.world_size
        drop_last = spec.split == "train"
        self.channels_last = settings.channels_last
        # Only called: a HostResize, or one wrapped to time its calls (bench.data).
        self.host_resize: Callable[[Sequence[torch.Tensor], torch.Tensor], torch.Tensor] | None = host_resize
        self.files = files
        self.bad_images = bad_images or BadImageLog("skip")
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.refill = drop_last and world_size > 1  # training under DDP: equal step counts (equal_step_counts)
        self.trace = Path(settings.trace_dir) / f"{spec.split}_rank{rank}" if settings.trace_dir else None
        self.copier = copier
        # The labels come from the catalog as pageable memory: pinned on a CUDA device, so that their copy is async
        # too (a batch's worth of int64s: the pinning costs nothing next to the copy it makes asynchronous).
        self.pin_labels = spec.device is not None and spec.device.type == "cuda" and torch.cuda.is_available()
        self.epoch = 0
        total = len(files)
        # The reader's part for this rank: [floor(r*N/W), floor((r+1)*N/W)), as DALI splits it (its shard_id).
        self.part_size = (rank + 1) * total // world_size - rank * total // world_size
        if drop_last:
            # Every rank takes the same number of steps (DDP would hang otherwise): the full batches of the
            # smallest part.
            self.length = (total // world_size) // batch_size
        else:
            self.length = math.ceil(self.part_size / batch_size)
        if self.length == 0:
            raise DataError(f"{total} images over {world_size} rank(s) make no full batch of {batch_size}")
        # The steps the trainer takes from an epoch (Lightning's rule for trainer.limit_train_batches).
        limit = spec.limit_batches
        self.steps_per_epoch = min(self.length, limit) if isinstance(limit, int) else int(self.length * limit)
        self.prefetch = max(0, int(settings.host_prefetch)) if host_resize is not None else 0
        ring = getattr(host_resize, "ring", None)
        if ring is not None and ring.slots < ring_slots(self.prefetch):
            raise ValueError(
                f"a ring of {ring.slots} batch buffers would overwrite batches still in use with prefetch="
                f"{self.prefetch}; it needs {ring_slots(self.prefetch)} (loader.ring_slots)"
            )
        self._worker = OneThreadExecutor("imgcls-dali-host") if self.prefetch else None
        # The pipeline is shut down when the loader is closed or collected, never left to DALI's __del__
        # (shut_down); at interpreter exit DALI's own atexit hook shuts down what is left, in the main thread.
        self._pipes = [pipe]  # the one pipeline; a list, so that the finalizer ends the one rebuilt last
        self._end = weakref.finalize(self, _release, self._pipes, self._worker)
        self._end.atexit = False  # type: ignore[misc]  # typeshed's finalize omits this documented attribute
        self._stop: threading.Event | None = None  # set to stop the running epoch's producer
        self.reader_positions = settings.saves_reader_position(spec.split)
        self.signature = list(signature)
        self.first_epoch = int(first_epoch)
        self._position: dict[str, Any] = {}  # where the consumer is (position())
        self._restored: dict[str, Any] | None = None  # the position built at, applied at the first iter()
        self._rebuild = rebuild
        self._outputs = outputs
        # What the consumer did with the last epoch it iterated (_finish_epoch): the DALI batches up to the last
        # one it was given, and whether it saw the epoch's end.
        self._started = self._ended = False
        self._taken_by_consumer = 0
        self._consumer_epoch = 0
        try:
            self._iterator = self._make_iterator(pipe, outputs, host_resize is not None)
        except BaseException:
            self._end()
            raise
        self._consumed = 0  # DALI batches taken in the current epoch
        self.copy = not getattr(pipe, "exec_dynamic", False)
        if restored:
            self.epoch, self._consumed = int(restored["epoch"]), int(restored["consumed"])
            self._restored = self._position = dict(restored)
        self._run_epoch = self.first_epoch + self.epoch  # the run's epoch of the batch trained on last

    def _make_iterator(self, pipe: Any, outputs: list[str], ragged: bool) -> Any:
        # PARTIAL for train too, and the batches past `length` are read and dropped here (_wanted), not with
        # DALI's DROP policy: the train reader pads every rank's part to ceil(N / W) records, and when the
        # smaller part N // W is a whole number of batches, DROP ends the epoch one padded batch before the
        # reader does; that batch (the part's last record repeated) then opened the next epoch, whose own
        # last records moved on to the epoch after, and so on. PARTIAL iterates the reader's whole epoch.
        policy = LastBatchPolicy.PARTIAL
        if not ragged:
            try:
                return DALIGenericIterator(
                    pipe, outputs, reader_name=READER, last_batch_policy=policy, auto_reset=False
                )
            except RuntimeError as exc:
                raise reader_error(exc) from None
        # The crops differ in size: a list of tensors, resized by HostResize.
        types = [DALIRaggedIterator.SPARSE_LIST_TAG] + [DALIRaggedIterator.DENSE_TAG] * (len(outputs) - 1)
        make = functools.partial(
            DALIRaggedIterator, pipe, outputs, reader_name=READER, output_types=types,
            last_batch_policy=policy, auto_reset=False,
        )  # fmt: skip
        # Built on the worker too: the iterator runs its first batch in its constructor.
        worker = self._worker
        try:
            if worker is not None and threading.current_thread() is not worker.thread:
                return worker.call(make)
            return make()
        except RuntimeError as exc:
            raise reader_error(exc) from None

    def close(self) -> None:
        """Stop the epoch in progress and the pipeline's executor now; the loader cannot be iterated again."""
        if self._stop is not None:
            self._stop.set()
        future = self._end()
        worker_thread = self._worker.thread if self._worker is not None else None
        if future is not None and threading.current_thread() is not worker_thread:
            future.result()

    def __len__(self) -> int:
        return self.length

    # Mid-epoch resume with DALI's reader positions (its checkpointing). Before taking each batch from DALI, the
    # loader takes the iterator's reader position (a few hundred bytes: the reader's place and every random
    # generator's state; ~0.2 ms), so the position of the batch the consumer trained on last is exact even though
    # the producer runs ahead of it. A resumed loader's pipeline is built from that position (DaliBackend.loader),
    # makes that batch again and skips the yields of it already trained on. Hand-written: DALI's iterator saves the
    # position of what it has taken, which with a prefetching producer is ahead of what the consumer has used.
    def position(self, steps_per_epoch: int | None = None) -> dict[str, Any]:
        """This rank's place in its epochs, to build a loader at (`restored`): {} before the first batch; `start`
        None where the pipeline saves no reader position (a resume then builds a fresh loader: of the next epoch
        where this one had ended, DaliBackend._start). `steps_per_epoch`: the steps the trainer takes from an epoch
        (trainer.limit_train_batches can make them fewer than len()); a position at the last of them, or at the
        end of the epoch, is the epoch's end, and a loader built at it goes on with the next epoch."""
        if not self._position:
            return {}
        limit = min(self.length, steps_per_epoch or self.length)
        done = self._position["done"] or self._position["steps"] >= limit
        # Left before the epoch's last batch: a fresh pipeline of the next epoch goes on from here (_finish_epoch).
        early = done and not self._position["done"] and self._left_early(self._position["consumed"] + 1)
        return {**self._position, "done": done, "early": early}

    # Lightning saves a stateful loader's state_dict() from rank 0 and loads it into every rank; the ranks' DALI
    # readers are at different places, so the state holds every rank's position (a collective: every rank's
    # state_dict() runs in the same checkpoint) and each rank's loader is built at its own (DaliBackend._start).
    def state_dict(self) -> dict[str, Any]:
        """{"positions": every rank's position() at the trainer's steps per epoch, "epoch": the run's epoch of the
        batch trained on last}."""
        return {"positions": gather_objects(self.position(self.steps_per_epoch)), "epoch": self._run_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing: a DALI loader takes its state when it is built (LoaderSpec.resume: the pipeline starts from
        its reader position; building one and then rebuilding it at the position cost seconds per start).
        Lightning's own call after a resume brings the same state, or one that a later stage's loader does not
        use."""

    def _taken(self, with_position: bool = True) -> Iterator[tuple[str | None, int, Any]]:
        """The rest of the reader's epoch: (reader position before the batch, DALI batches taken before it, batch)."""
        with_position = with_position and self.reader_positions
        while True:
            start = self._iterator.checkpoints()[0] if with_position else None
            try:
                batch = next(self._iterator)
            except StopIteration:
                return
            self._consumed += 1
            yield start, self._consumed - 1, batch

    def _left_early(self, taken: int) -> bool:
        """Whether a consumer that was given the epoch's DALI batches up to TAKEN (not its end) left before the
        epoch's last wanted batch: trainer.limit_*_batches, or a run stopped mid-epoch."""
        return taken < self.length

    def _finish_epoch(self, restored: dict[str, Any] | None = None) -> None:
        # DALI cannot reset mid-epoch. An epoch the consumer left before its last batch (limit_train_batches,
        # limit_val_batches: gpu-check's rows take 2) goes on with a new pipeline built for the next epoch, as a
        # resumed run does (DaliBackend.loader): running out the rest decoded the whole split at every epoch's start
        # (1,083 s on an ImageNet-size folder). The decision reads what the consumer took, never how far the
        # producer thread ran ahead, so that an uninterrupted run and a resumed one take the same path.
        # An epoch left at its last batch, or that a restored position had ended (its last batch is made again), is
        # run out: what is left is the reader's padding, at most a batch or two. A restored position inside its
        # epoch goes on there.
        # With next(), not a for loop: iter() on DALI's iterator resets it when it has given batches, and a reset
        # at the end of an epoch that has not raised StopIteration yet (the trainer stops at len(), the usual
        # case) starts the next epoch, which the loop then ran out too: a whole epoch decoded and thrown away at
        # every epoch's start.
        if restored is not None and not restored["done"]:
            return
        if (
            restored is None
            and self._rebuild is not None
            and self._started
            and not self._ended
            and self._left_early(self._taken_by_consumer)
        ):
            self._next_pipeline()
            return
        if self._consumed or restored is not None:
            for _ in self._taken(with_position=False):
                pass
            self._iterator.reset()
            self._consumed = 0
            self.epoch += 1

    def _next_pipeline(self) -> None:
        """The epoch after the one the consumer left, from a new pipeline built for it (`rebuild`); the old one is
        shut down first. Counted from the consumer's epoch: whether the producer had reached the reader's end (and
        counted it) depends on the thread's timing, and a resumed run counts from the saved position's epoch."""
        epoch = self.first_epoch + self._consumer_epoch + 1
        old, self._iterator = self._iterator, None
        del old
        shut_down(self._pipes[0])
        rebuild = self._rebuild
        assert rebuild is not None  # called only for a loader that was given one (the condition above)
        self._pipes[0] = pipe = rebuild(epoch)
        self._iterator = self._make_iterator(pipe, self._outputs, self.host_resize is not None)
        self.first_epoch, self.epoch, self._consumed = epoch, 0, 0

    def _record_bad(self, keys: torch.Tensor) -> None:
        """The policy for the samples the pipeline flagged."""
        self.bad_images.record(self.files.bad_samples(keys))

    def _prepare(self, out: dict[str, Any]) -> _Batch:
        """A DALI batch without its bad files, resized (HostResize) or laid out; no side effects."""
        index = out["index"].long().cpu()
        # A key per sample: a folder's sample index, or a shard record's (shard, offset, stored label).
        if index.dim() > 1 and index.shape[-1] == 1:
            index = index.reshape(-1)
        read = index
        if index.numel() == 0:  # PARTIAL can end a short part with an empty batch
            return _Batch(read, index, None)
        images, mirror = out["data"], out.get("mirror")
        flags = out["bad"].reshape(-1).bool().cpu()
        bad = index[flags]
        if bad.numel():
            keep = ~flags
            index = index[keep]
            if isinstance(images, list):  # the ragged crops of the torch resize
                images = [image for image, k in zip(images, keep.tolist()) if k]
                mirror = out["mirror"][keep]  # the torch resize's crops come with their flips
            else:
                images = images[keep]  # a new tensor: no buffer shared with DALI
            out = {k: v[keep] if k == "crop_shape" else v for k, v in out.items()}
            # As the torchvision backend: an empty batch is not yielded, nor in training one left
            # with a single sample, which BatchNorm cannot normalize.
            if len(index) < (2 if self.drop_last else 1):
                return _Batch(read, bad, None)
        if self.host_resize is not None:  # writes a new batch: no buffer shared with DALI
            assert mirror is not None, "the torch resize's pipeline outputs its crops' flips (backend.py)"
            images = self.host_resize(images, mirror)
        elif self.channels_last:  # NHWC from CMN -> an NCHW view with channels_last strides
            images = images.permute(0, 3, 1, 2)
        if self.copy and self.host_resize is None:  # the classic executor reuses its buffers (docstring)
            images = images.clone()
        labels = self.files.labels(index)
        result: tuple[torch.Tensor, ...] = (images, labels.pin_memory() if self.pin_labels else labels)
        if "crop_shape" in out:
            result = (*result, out["crop_shape"].clone())
        return _Batch(read, bad, result)

    def _results(self, worker: Any, trace: Any, owed: int, retraced: bool) -> Iterator[_Batch | None]:
        """The epoch's usable batches; None for one that bad files left unusable (an empty PARTIAL end is no
        batch). `owed`, `retraced`: a resumed epoch's repeats owed, and whether its first batch is in the trace."""
        for batch in self._background_epoch(worker) if worker is not None else self._epoch():
            if trace is not None and not retraced:  # what the reader read, bad files included
                trace.write(" ".join(self.files.trace_tokens(batch.read)) + "\n")
            retraced = False
            if batch.bad.numel():
                self._record_bad(batch.bad)
            if batch.result is not None:
                batch.owed, owed = owed, 0
                yield batch
            elif batch.bad.numel():
                owed += self.refill
                yield None

    def _wanted(self) -> bool:
        """Whether the DALI batch just taken is one of the epoch's `length` (train: the rest is padding and
        records past the smallest part's full batches, read only to end the reader's epoch)."""
        return not self.drop_last or self._consumed <= self.length

    def _made(self, start: str | None, consumed: int, batch: Any) -> _Batch:
        made = self._prepare(batch[0])
        made.start, made.epoch, made.consumed = start, self.epoch, consumed
        if made.result is not None and self.copier is not None:
            # Here, in the thread that made it: its copy runs while the consumer's step on the batch before does.
            made.result = self.copier.stage(made.result)
        return made

    def _epoch(self) -> Iterator[_Batch]:
        """This epoch's batches, made in the consumer's thread."""
        for start, consumed, batch in self._taken():
            if self._wanted():
                yield self._made(start, consumed, batch)
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
            return False  # the consumer left: the next _finish_epoch decides what becomes of the epoch

        try:
            for start, consumed, batch in self._taken():
                if self._wanted() and not put(("batch", self._made(start, consumed, batch))):
                    return
            self._iterator.reset()
            self._consumed = 0
            self.epoch += 1
            put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - raised again in the consumer
            put(("error", exc))

    def _background_epoch(self, worker: OneThreadExecutor) -> Iterator[_Batch]:
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
        try:
            yield from self._batches()
        except RuntimeError as exc:
            error = reader_error(exc)
            if error is exc:
                raise
            raise error from None

    def _batches(self) -> Iterator[tuple[torch.Tensor, ...]]:
        worker = self._worker
        restored, self._restored = self._restored, None
        # Inside its epoch: skip what was trained on.
        at = restored if restored is not None and not restored["done"] else None
        resumed = at is not None
        finish = functools.partial(self._finish_epoch, restored)
        if worker is not None:
            if self._stop is not None:
                self._stop.set()  # an earlier iterator's producer, left mid-epoch and not closed
            worker.call(finish)  # after that producer has returned: one task at a time
        else:
            finish()
        # The epoch (of this pipeline) the consumer iterates now; the producer thread moves self.epoch on when it
        # reaches the reader's end, which may come before or after the consumer leaves (_next_pipeline).
        self._consumer_epoch = self.epoch
        skip = int(at["yielded"]) if at is not None else 0
        owed = int(at["owed"]) if at is not None else 0
        steps = int(at["steps"]) - skip if at is not None else 0
        trace = None
        if self.trace is not None:
            self.trace.parent.mkdir(parents=True, exist_ok=True)
            epoch = self.first_epoch + self.epoch  # the run's epoch: a rebuilt pipeline counts from its own first
            trace = open(f"{self.trace}_epoch{epoch}.txt", "a" if resumed else "w")  # noqa: SIM115 - closed below
        self._started, self._ended = True, False
        self._taken_by_consumer = int(at["consumed"]) + 1 if at is not None else 0
        stop: threading.Event | None = None  # this epoch's producer's (not a later epoch's: see finally)
        try:
            previous, yielded = None, 0
            for batch in equal_step_counts(self._results(worker, trace, owed, resumed), self.refill, owed):
                stop = self._stop if worker is not None else None  # made by _background_epoch before its first batch
                yielded = yielded + 1 if batch is previous else 1
                previous = batch
                steps += 1
                if skip:
                    skip -= 1
                    continue
                self._taken_by_consumer = batch.consumed + 1
                self._run_epoch = self.first_epoch + batch.epoch
                # Also without a reader position (data.dali_checkpointing=false, start None): where the consumer
                # is in its epoch still tells a resume whether that epoch had ended (DaliBackend._start).
                self._position = {
                    "start": batch.start, "epoch": batch.epoch, "consumed": batch.consumed, "owed": batch.owed,
                    "yielded": yielded, "steps": steps, "done": False, "signature": self.signature,
                    "first_epoch": self.first_epoch,
                }  # fmt: skip
                yield batch.result if self.copier is None else self.copier.hand_over(batch.result)
            self._ended = True
            if self._position:
                self._position = {**self._position, "done": True}
        finally:
            # The consumer raised (e.g. data.on_bad_image=error) or left early. This epoch's event only: an
            # iterator left behind and closed after the next epoch's began must not stop that epoch's producer.
            if stop is not None:
                stop.set()
            if trace is not None:
                trace.close()
