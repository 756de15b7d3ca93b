"""The dali_cpu / dali_gpu data backends: DALI pipelines behind the same loader interface as torchvision.

`DaliBackend.loader()` builds a pipeline (pipelines.py) for one rank and wraps DALI's
`DALIGenericIterator` (or `DALIRaggedIterator` when the torch resize of host_resize.py takes the crops) in
`DaliLoader` (loader.py), the thin Lightning adapter. The adapter is hand-written because
Lightning has no DALI integration (Lightning #791, won't fix) and DALI's iterator alone breaks under it:
- Lightning prefetches one batch ahead, so a batch must outlive the next iterator call. DALI's classic
  executor owned its output buffers until the next call (DALI PR #3239); with DALI 2's dynamic executor
  (the default; pyproject requires DALI >= 2.4) every batch gets its own buffer, kept alive by the
  DLPack tensor the plugin returns without copying. The adapter copies only under the classic executor:
  a batch-sized float copy costs a fifth of the whole CPU pipeline (docs/data-backends.md).
  test_dali.py checks that held batches stay intact.
- Lightning needs the length of this rank's epoch and a fresh epoch on every `iter()`; DALI's iterator
  warns and ignores a reset before its epoch ends (limit_*_batches): the adapter starts the next epoch with a new
  pipeline (`pipeline(epoch)` below).
- The reader's label is the sample index (pipelines.py); the adapter maps it to the class label
  from the same folder walk as torchvision's ImageFolder, so labels are identical by construction, and it
  can record which samples a rank read (data.trace_dir).
- Shard files (data.format=tfrecord|webdataset) go through DALI's own TFRecord / WebDataset readers
  (pipelines.ShardSource); remote shards are copied to data.shard_cache first (shards/remote.py) and
  TFRecord index files are found or made there (shards/tfrecord.py), never in the data folder. Their
  keys, labels and names: records.py.
- Bad files are found as DALI reads them (pipelines.check_encoded), not by opening every file before
  training: the adapter drops the flagged samples from their batch and applies data.on_bad_image, as the
  torchvision backend does with its workers' bad samples. On ImageNet, a scan before training cost minutes
  per rank at every start; see docs/data-backends.md "Startup".
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from imgcls.data.augment import parse_randaugment
from imgcls.data.bad_images import BadImageLog
from imgcls.data.dali.batch_ring import BatchRing
from imgcls.data.dali.host_resize import HostResize, resize_on_host
from imgcls.data.dali.loader import Catalog, DaliLoader, reader_error, ring_slots
from imgcls.data.dali.pipelines import FolderSource, ShardSource, interp_type, train_pipeline, val_pipeline
from imgcls.data.dali.records import ShardCatalog, shuffle_fill
from imgcls.data.file_list import FileList
from imgcls.data.folder import check_same_classes, classes_of, split_dir
from imgcls.data.shards.manifest import open_shard_set
from imgcls.data.shards.remote import local_copies
from imgcls.data.shards.tfrecord import dali_index_files
from imgcls.data.tf_crop import crop_spec
from imgcls.data.transforms import val_resize_size
from imgcls.distributed import made_once
from imgcls.errors import ConfigError, DataError
from imgcls.seeding import dali_list_order, dali_pipeline_seed


class DaliBackend:
    """An ImageFolder layout or shard files (data.format) read by DALI. device="cpu" (dali_cpu) or "gpu"
    (dali_gpu: nvJPEG + GPU resize)."""

    builds_at_position = True  # loader(position=...): a resumed train loader restored in its first build

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
        self.format = str(cfg.get("format") or "folder")
        if self.format == "folder":
            self.shards = None
            self.classes = classes_of(cfg.root, "train")
            check_same_classes(self.classes, classes_of(cfg.root, "val"), cfg.root)
        else:
            self.shards = open_shard_set(cfg)
            self.classes = list(self.shards.classes)
        self._files: dict[str, FileList | ShardCatalog] = {}
        self.bad_images = BadImageLog(str(cfg.get("on_bad_image") or "skip"))

    def files(self, split: str) -> FileList | ShardCatalog:
        """A folder: the split's files and classes in ImageFolder's order (the same walk, so the same labels).
        Shards: the split's shard files as local paths (remote ones copied to data.shard_cache first). No
        image is opened here: bad files are found while DALI reads them (dali/pipelines.py check_encoded)."""
        if split not in self._files:
            if self.shards is None:
                # One rank walks the tree (1.33M entries on ImageNet, seconds to minutes on network storage)
                # and sends the compact list (~4 MB) to the others, which would each walk it again.
                root = split_dir(self.cfg.root, split)
                self._files[split] = made_once(lambda: FileList(root, self.classes))
            else:
                self._files[split] = ShardCatalog(self.shards, split, self._local_paths(split))
        return self._files[split]

    def _local_paths(self, split: str) -> list[str]:
        # DALI reads local files only: every shard of the split is copied before the pipeline starts, eight
        # downloads at a time (one S3 stream reaches a fraction of a node's bandwidth).
        urls = [s.url for s in self.shards.splits[split]]  # type: ignore[union-attr]
        options = dict(self.cfg.get("storage_options") or {})
        return local_copies(urls, str(self.cfg.shard_cache), options)

    def _shard_source(self, files: ShardCatalog, split: str, world_size: int, seed: int, epoch: int) -> ShardSource:
        """The shard files in reading order: train's are permuted by the run seed (each rank's contiguous
        range of records then spans other files for another seed), val's stay in the manifest's order."""
        paths = list(files.paths)
        if split == "train":
            paths = [paths[i] for i in dali_list_order(seed, len(paths), epoch)]
        index_paths: list[str] = []
        if self.format == "tfrecord":
            index_paths = dali_index_files(paths, self.cfg.get("index_dir"), str(self.cfg.shard_cache))
        fill = shuffle_fill(len(files) // world_size)
        return ShardSource(self.format, tuple(paths), tuple(index_paths), fill)

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
        first_epoch: int = 0,
        position: dict[str, Any] | None = None,
        device: Any = None,  # the training device: DALI's pipelines place their output on device_id themselves
    ) -> DaliLoader:
        """`first_epoch`: the epoch this loader starts at when it is built for a later epoch than the run's first
        (a progressive-resizing stage, a resumed run): its list order and pipeline seed derive from it
        (seeding.dali_pipeline_seed), so that it does not replay epoch 0's order and augmentation draws.
        `position`: a resumed run's DaliLoader.position(): the train pipeline is built from its DALI checkpoint and
        the loader goes on from there, with the list order and seed of the loader that saved it (the checkpoint
        points into that order), whatever `first_epoch` says; a position at the end of an epoch the trainer left
        early (DaliLoader.position's `early`) starts the next epoch fresh, as the loader that saved it would have.
        Ignored when empty, when the reader does not checkpoint, or when saved by a loader of another signature
        (another progressive-resizing size, another per-device batch): the loader then starts fresh at
        `first_epoch`."""
        cfg = self.cfg
        size = int(image_size or cfg.image_size)
        checkpointing = split == "train" and bool(cfg.get("dali_checkpointing", True))
        signature = (split, size, augment_magnitude, with_crop_shape, batch_size)
        usable = (
            checkpointing
            and position
            and list(position.get("signature", ())) == list(signature)
            and position.get("first_epoch") is not None
        )
        if usable and position.get("done") and position.get("early"):  # type: ignore[union-attr]
            first_epoch = int(position["first_epoch"]) + int(position["epoch"]) + 1  # type: ignore[index]
            position = None  # nothing of the saved pipeline is needed (DaliLoader._finish_epoch)
        elif usable:
            first_epoch = int(position["first_epoch"])  # type: ignore[index]
        else:
            position = None  # another graph (e.g. another progressive size or batch): a fresh start
        files = self.files(split)
        if len(files) < world_size:
            where = split_dir(cfg.root, split) if self.shards is None else f"{cfg.root} ({split} shards)"
            raise DataError(f"{where} has {len(files)} images, fewer than {world_size} ranks")
        if isinstance(files, ShardCatalog):
            # DALI's shard readers split the records among the ranks themselves (pipelines._read_records).
            def opened(epoch: int) -> AbstractContextManager:
                return contextlib.nullcontext(self._shard_source(files, split, world_size, seed, epoch))

            part = (rank, world_size)
        else:
            opened = functools.partial(_listed, files, split, rank, world_size, seed)
            # Train: every rank's reader gets the whole list and reads its part; val: only its part (_listed).
            part = (rank, world_size) if split == "train" else (0, 1)
        return self._loader(files, opened, split, batch_size, rank, world_size, seed, size, augment_magnitude,
                            with_crop_shape, part, first_epoch, position, checkpointing, signature)  # fmt: skip

    def _loader(
        self,
        files: Catalog,
        opened: Callable[[int], AbstractContextManager],
        split: str,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        size: int,
        augment_magnitude: int | None,
        with_crop_shape: bool,
        part: tuple[int, int],
        first_epoch: int,
        position: dict[str, Any] | None,
        checkpointing: bool,
        signature: tuple,
    ) -> DaliLoader:
        cfg = self.cfg
        training = split == "train"
        common = {
            "shard_id": part[0],  # the reader's part of the samples, DALI's shard (loader)
            "num_shards": part[1],
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
                ring=BatchRing(ring_slots(self.host_prefetch)),  # as many as the loader's queue keeps alive
            )
        # Reader checkpointing (DALI's reader place and random states, for a resume at the exact batch:
        # loader.DaliLoader.position): 0.2 ms a batch, and a second copy of the names in the reader.
        if training:
            randaugment = parse_randaugment(str(cfg.randaugment)) if cfg.augment == "randaugment" else (2, 9)
            if augment_magnitude is not None:
                randaugment = (randaugment[0], int(augment_magnitude))
            make: Callable[..., Any] = functools.partial(
                train_pipeline,
                **common,
                crop_scale=list(cfg.train_crop_scale),
                crop_ratio=list(cfg.train_crop_ratio),
                hflip=float(cfg.hflip),
                antialias=bool(cfg.get("dali_train_antialias")),
                augment=cfg.augment,
                autoaugment_policy=str(cfg.get("autoaugment_policy", "v0")),
                randaugment=randaugment,
                with_crop_shape=with_crop_shape,
                host_resize=host_resize is not None,
                tf_crop=crop_spec(cfg) if cfg.get("train_crop") == "tf" else None,  # data/tf_crop.py
                object_boxes=bool(cfg.get("train_crop_object_boxes")),
                # DALI's auto_aug policies branch on data nodes, which needs conditionals; building them converts
                # the pipeline's source with DALI's autograph (~1 s a build), so only when an augment policy runs.
                enable_conditionals=cfg.augment is not None,
                enable_checkpointing=checkpointing,
            )
        else:
            make = functools.partial(val_pipeline, **common, resize=val_resize_size(cfg, common["size"]))

        def pipeline(epoch: int, checkpoint: str | None = None) -> Any:
            """The pipeline with EPOCH's list order and seed (seeding.dali_list_order, dali_pipeline_seed)."""
            seeded = functools.partial(make, seed=dali_pipeline_seed(seed, rank, epoch))
            return _built(seeded, functools.partial(opened, epoch), checkpoint)

        pipe = pipeline(first_epoch, position["start"] if position else None)
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
            checkpointing=checkpointing,
            signature=signature,
            first_epoch=first_epoch,
            restored=position,
            rebuild=pipeline,
        )


def _built(
    make: Callable[..., Any], opened: Callable[[], AbstractContextManager], checkpoint: str | None = None
) -> Any:
    """The pipeline of `make` over the source `opened` gives, built (a folder's list file is read now and goes
    right after); `checkpoint`: restored from that DALI checkpoint (a resumed loader's position)."""
    with opened() as source:
        pipe = make(source=source, checkpoint=checkpoint)
        try:
            pipe.build()
        except RuntimeError as exc:
            raise reader_error(exc) from None
        return pipe


@contextlib.contextmanager
def _listed(files: FileList, split: str, rank: int, world_size: int, seed: int, epoch: int) -> Iterator[FolderSource]:
    """A FolderSource whose list file exists while the pipeline is built."""
    listing = tempfile.NamedTemporaryFile(prefix="imgcls-dali-", suffix=".txt", delete=False)  # noqa: SIM115
    listing.close()
    try:
        if split == "train":
            # The whole list, in the run seed's order: DALI reshuffles the whole list before every epoch
            # (shuffle_after_epoch) and each rank reads its part of that permutation, so every rank needs every
            # name.
            files.write_list(listing.name, order=dali_list_order(seed, len(files), epoch))
        else:
            # Val reads its own contiguous part in order every epoch (stick_to_shard, no shuffle): DALI given
            # only that part reads the same samples, and holds 1/world_size of the names.
            files.write_list(listing.name, rank * len(files) // world_size, (rank + 1) * len(files) // world_size)
        yield FolderSource(listing.name, files.root)
    finally:
        os.unlink(listing.name)
