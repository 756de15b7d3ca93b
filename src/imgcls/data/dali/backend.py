"""The dali_cpu / dali_gpu data backends: DALI pipelines behind the same loader interface as torchvision.

`DaliBackend.loader()` builds a pipeline (pipelines.py) for one rank's LoaderSpec (data/protocol.py) and wraps DALI's
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
- Lightning copies a batch to the GPU when its step starts, on the compute stream, and DALI's host outputs are
  pageable (no device_id): a copy CUDA documents as synchronous with the host. On a CUDA training device every
  batch reaches it from pinned memory, ahead of its step, off the compute stream (settings.Delivery): dali_cpu's
  pipeline ends in `.gpu()` as NVIDIA's where DALI resizes (validation included), the torch resize writes pinned
  batches, and the loader copies the rest (those batches, the labels) on a side stream (device_prefetch.py).
- Bad files are found as DALI reads them (pipelines.check_encoded), not by opening every file before
  training: the adapter drops the flagged samples from their batch and applies data.on_bad_image, as the
  torchvision backend does with its workers' bad samples. On ImageNet, a scan before training cost minutes
  per rank at every start; see docs/data-backends.md "Startup".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from imgcls.data.bad_images import BadImageLog
from imgcls.data.dali.batch_ring import BatchRing
from imgcls.data.dali.host_resize import HostResize, resize_on_host
from imgcls.data.dali.loader import Catalog, DaliLoader, reader_error, ring_slots
from imgcls.data.dali.pipelines import FolderSource, ShardSource, interp_type, train_pipeline, val_pipeline
from imgcls.data.dali.records import ShardCatalog, shuffle_fill
from imgcls.data.dali.settings import DaliSettings, Delivery
from imgcls.data.device_normalize import DeviceNormalize
from imgcls.data.device_prefetch import copier_for
from imgcls.data.file_list import FileList
from imgcls.data.folder import folder_classes, split_dir
from imgcls.data.protocol import LoaderSpec
from imgcls.data.shards.manifest import ShardSet, open_shard_set
from imgcls.data.shards.remote import local_copies
from imgcls.data.shards.tfrecord import dali_index_files
from imgcls.data.transforms import val_resize_size
from imgcls.distributed import made_once
from imgcls.errors import ConfigError, DataError
from imgcls.seeding import dali_list_order, dali_pipeline_seed

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema

log = logging.getLogger(__name__)


class DaliBackend:
    """An ImageFolder layout or shard files (data.format) read by DALI. device="cpu" (dali_cpu) or "gpu"
    (dali_gpu: nvJPEG + GPU resize)."""

    def __init__(self, cfg: DataSchema, device: str = "cpu") -> None:
        if device == "gpu" and not torch.cuda.is_available():
            raise ConfigError("data.backend=dali_gpu needs a CUDA GPU and this machine has none; use dali_cpu")
        self.cfg = cfg
        interp_type(str(cfg.interpolation))  # fail early on an interpolation DALI lacks
        # What the pipelines and the loader read of the config, once; a test may replace it (with_crop_shape).
        self.settings = DaliSettings.from_config(cfg, gpu=device == "gpu")
        settings = self.settings
        dtype = torch.float16 if settings.fp16 else torch.float32
        self.normalize = DeviceNormalize(settings.mean, settings.std, settings.channels_last, dtype)
        self.format = str(cfg.format)
        if self.format == "folder":
            self.shards = None
            self.classes = folder_classes(cfg.root, cfg.class_names)
        else:
            self.shards = open_shard_set(cfg)
            self.classes = list(self.shards.classes)
        self._files: dict[str, FileList | ShardCatalog] = {}
        self.bad_images = BadImageLog(str(cfg.on_bad_image))
        self._warned_world = False

    @property
    def gpu(self) -> bool:
        return self.settings.gpu

    def on_device(self, batch: Any) -> Any:
        """dali_cpu's uint8 batches normalized on their device (pipelines._finish); dali_gpu's, normalized by CMN
        on the GPU, pass through."""
        return (self.normalize(batch[0]), *batch[1:])

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
                self._files[split] = ShardCatalog(self.shards, split, self._local_paths(self.shards, split))
        return self._files[split]

    def _local_paths(self, shards: ShardSet, split: str) -> list[str]:
        # DALI reads local files only: every shard of the split is copied before the pipeline starts, eight
        # downloads at a time (one S3 stream reaches a fraction of a node's bandwidth).
        urls = [s.url for s in shards.splits[split]]
        options = dict(self.cfg.storage_options)
        return local_copies(urls, str(self.cfg.shard_cache), options)

    def _shard_source(self, files: ShardCatalog, split: str, world_size: int, seed: int, epoch: int) -> ShardSource:
        """The shard files in reading order: train's are permuted by the run seed (each rank's contiguous
        range of records then spans other files for another seed), val's stay in the manifest's order."""
        paths = list(files.paths)
        if split == "train":
            paths = [paths[i] for i in dali_list_order(seed, len(paths), epoch)]
        index_paths: list[str] = []
        if self.format == "tfrecord":
            index_paths = dali_index_files(paths, self.cfg.index_dir, str(self.cfg.shard_cache))
        fill = shuffle_fill(len(files) // world_size)
        return ShardSource(self.format, tuple(paths), tuple(index_paths), fill)

    def loader(self, spec: LoaderSpec) -> DaliLoader:
        """One rank's loader of SPEC. Its list order and pipeline seed derive from `spec.first_epoch`
        (seeding.dali_pipeline_seed), so that a loader built for a later epoch than the run's first (a
        progressive-resizing stage, a resumed run) does not replay epoch 0's order and augmentation draws.
        `spec.resume` (a train loader's state_dict(): every rank's position) is read by _start."""
        size = int(spec.image_size or self.settings.image_size)
        signature = (spec.split, size, spec.augment_magnitude, self.settings.with_crop_shape, spec.batch_size)
        first_epoch, position = self._start(spec, signature)
        files = self.files(spec.split)
        split, rank, world_size, seed = spec.split, spec.rank, spec.world_size, spec.seed
        if len(files) < world_size:
            where = split_dir(self.cfg.root, split) if self.shards is None else f"{self.cfg.root} ({split} shards)"
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
        return self._loader(files, opened, spec, size, part, first_epoch, position, signature)

    def _start(self, spec: LoaderSpec, signature: tuple) -> tuple[int, dict[str, Any] | None]:
        """(first epoch, this rank's position to build at or None) of a loader of SPEC.

        A resumed train loader is built at its rank's saved position, with the list order and seed of the loader
        that saved it (the reader position points into that order), whatever `first_epoch` says; a position at the
        end of an epoch the trainer left early (DaliLoader.position's `early`) starts the next epoch fresh, as the
        loader that saved it would have. A position saved by another number of ranks, by a loader of another
        signature (another progressive-resizing size, another per-device batch), or none at all
        (data.dali_checkpointing=false) gives a fresh loader, seeded from the epoch the run resumes in: the saved
        epoch, or the next one where every saved position had ended its epoch (a Lightning checkpoint at an epoch's
        end)."""
        first_epoch = spec.first_epoch
        state = spec.resume if spec.split == "train" else None
        if not state:
            return first_epoch, None
        positions = list(state.get("positions", state.get("dali")) or [])  # "dali": an earlier imgcls's layout
        if state.get("epoch") is not None:
            ended = bool(positions) and all(p and p.get("done") for p in positions)
            first_epoch = max(first_epoch, int(state["epoch"]) + int(ended))
        position = None
        if positions and len(positions) != spec.world_size:
            if not self._warned_world:
                log.warning(
                    "resuming %d ranks from %d: the DALI readers start epoch %d again instead of at the saved batch",
                    spec.world_size, len(positions), first_epoch,
                )  # fmt: skip
                self._warned_world = True
        elif positions:
            position = positions[spec.rank]
        usable = (
            self.settings.saves_reader_position(spec.split)
            and position
            and list(position.get("signature", ())) == list(signature)
            and position.get("first_epoch") is not None
        )
        if not usable or position is None:
            return first_epoch, None  # another graph (e.g. another progressive size or batch): a fresh start
        if position.get("done") and position.get("early"):
            # Nothing of the saved pipeline is needed (DaliLoader._finish_epoch): the next epoch, fresh.
            return int(position["first_epoch"]) + int(position["epoch"]) + 1, None
        return int(position["first_epoch"]), position

    def _torch_resizes(self, spec: LoaderSpec) -> bool:
        """Whether SPEC's loader resizes in torch (host_resize.resize_on_host): train only."""
        settings, size = self.settings, int(spec.image_size or self.settings.image_size)
        if spec.split != "train":
            return False
        return resize_on_host(settings.train_resize, settings.gpu, settings.augment, settings.interpolation, size)

    def delivery(self, spec: LoaderSpec) -> Delivery:
        """How the batches of SPEC's loader reach its training device (settings.Delivery)."""
        return self.settings.delivery(spec.device, self._torch_resizes(spec))

    def pipeline_maker(self, spec: LoaderSpec, part: tuple[int, int]) -> Callable[..., Any]:
        """SPEC's pipeline (train_pipeline or val_pipeline) for this rank's `part` (DALI's shard_id, num_shards),
        still to be given its source, seed and reader position (`checkpoint`)."""
        settings, size = self.settings, int(spec.image_size or self.settings.image_size)
        delivery = self.delivery(spec)
        common = {
            "settings": settings,
            "shard_id": part[0],  # the reader's part of the samples, DALI's shard (loader)
            "num_shards": part[1],
            "size": size,
            "batch_size": spec.batch_size,
            "num_threads": settings.num_threads,
            # dali_cpu touches CUDA only for a CUDA training device (settings.Delivery), so it runs without a GPU.
            "device_id": delivery.device_id,
            "prefetch_queue_depth": settings.prefetch_queue_depth,
            "to_device": delivery.pipeline_copies,
        }
        if spec.split != "train":
            return functools.partial(val_pipeline, **common, resize=val_resize_size(self.cfg, size))
        randaugment = settings.randaugment
        if spec.augment_magnitude is not None:
            randaugment = (randaugment[0], int(spec.augment_magnitude))
        # Reader positions (DALI's checkpointing: the reader's place and random states, for a resume at the exact
        # batch: loader.DaliLoader.position): 0.2 ms a batch, and a second copy of the names in the reader.
        return functools.partial(
            train_pipeline,
            **common,
            randaugment=randaugment,
            host_resize=self._torch_resizes(spec),
            # DALI's auto_aug policies branch on data nodes, which needs conditionals; building them converts
            # the pipeline's source with DALI's autograph (~1 s a build), so only when an augment policy runs.
            enable_conditionals=settings.augment is not None,
            enable_checkpointing=settings.saves_reader_position(spec.split),
        )

    def _loader(
        self,
        files: Catalog,
        opened: Callable[[int], AbstractContextManager],
        spec: LoaderSpec,
        size: int,
        part: tuple[int, int],
        first_epoch: int,
        position: dict[str, Any] | None,
        signature: tuple,
    ) -> DaliLoader:
        settings = self.settings
        delivery = self.delivery(spec)
        host_resize: HostResize | None = None
        if self._torch_resizes(spec):
            host_resize = HostResize(
                size,
                settings.interpolation,
                antialias=settings.antialias,
                pin_memory=delivery.pinned_resize,
                threads=settings.resize_threads,
                ring=BatchRing(ring_slots(settings.host_prefetch)),  # as many as the loader's queue keeps alive
            )
        make = self.pipeline_maker(spec, part)

        def pipeline(epoch: int, reader_position: str | None = None) -> Any:
            """The pipeline with EPOCH's list order and seed (seeding.dali_list_order, dali_pipeline_seed)."""
            seeded = functools.partial(make, seed=dali_pipeline_seed(spec.seed, spec.rank, epoch))
            return _built(seeded, functools.partial(opened, epoch), reader_position)

        pipe = pipeline(first_epoch, position["start"] if position else None)
        outputs = ["data", "index", "bad"] + (["mirror"] if host_resize else [])
        outputs += ["crop_shape"] if settings.with_crop_shape else []
        return DaliLoader(
            pipe,
            outputs,
            files,
            spec,
            settings,
            host_resize=host_resize,
            bad_images=self.bad_images,
            signature=signature,
            first_epoch=first_epoch,
            restored=position,
            rebuild=pipeline,
            copier=copier_for(spec.device) if delivery.side_stream else None,
        )


def _built(
    make: Callable[..., Any], opened: Callable[[], AbstractContextManager], reader_position: str | None = None
) -> Any:
    """The pipeline of `make` over the source `opened` gives, built (a folder's list file is read now and goes
    right after); `reader_position`: restored at that reader position (DALI's checkpoint; a resumed loader's)."""
    with opened() as source:
        pipe = make(source=source, checkpoint=reader_position)
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
