"""DALI train and val pipelines (the `nvidia.dali.fn` API), following NVIDIA's IC/dataloaders.py.

Differences from NVIDIA's PyTorch code, each on purpose:
- train decodes with the fused `fn.decoders.image_random_crop` (ROI decode: only the crop's region
  of the JPEG is decoded, as NVIDIA's TF1/TF2 DALI pipelines do) instead of full decode +
  `random_resized_crop`; on 2 CPU cores this is what puts the pipeline past a plain full decode.
- the reader is the only part that depends on data.format (_read_rank_part): a folder's file reader, whose
  "label" is the sample index that the loader maps to the class (file_list.FileList.labels), or DALI's
  TFRecord / WebDataset readers, whose records get a (shard, offset, stored label) key (records.py); either
  way the loader knows which samples each rank read.
- data.train_crop=tf (NVIDIA's TF recipes): TF's sample_distorted_bounding_box chooses the window in Python
  (tf_crop.sample_windows, fed by DALI's own random numbers) and `fn.decoders.image_slice` decodes it. DALI's
  `fn.random_bbox_crop` is not that sampler: it draws each side's scale and checks the aspect afterwards, in
  relative coordinates, with thresholds tried per attempt and no whole-image fallback after the attempts.
- val antialiases its resize (PIL does), so DALI and torchvision validate the same pixels.
- every encoded file passes `check_encoded` (image_scan.scan_bytes) before the decoder: a bad file becomes a
  tiny placeholder image flagged in the extra "bad" output, which the loader drops and reports (loader.py),
  so one bad file among a million neither stops the pipeline nor needs a scan of every file before training.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import nvidia.dali.math as dmath
import nvidia.dali.tfrecord as tfrec
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.auto_aug import rand_augment
from nvidia.dali.data_node import DataNode
from nvidia.dali.types import DALIDataType, DALIImageType, DALIInterpType

from imgcls.data.augment import AUTOAUGMENT_TRANSLATE_PIXELS
from imgcls.data.dali import records
from imgcls.data.dali.settings import DaliSettings
from imgcls.data.dali.tf_autoaugment import nvidia_auto_augment, v0_policy
from imgcls.data.image_scan import scan_bytes
from imgcls.data.shards.tfrecord import BOX_KEYS, IMAGE_KEY, LABEL_KEY
from imgcls.data.shards.webdataset import IMAGE_EXTENSIONS, LABEL_EXTENSION
from imgcls.data.tf_crop import UNIFORMS_PER_ATTEMPT, DistortedCrop, padded_boxes, sample_windows
from imgcls.errors import ConfigError

READER = "Reader"  # the reader's name, for DALIGenericIterator(reader_name=...)

INTERPOLATION = {
    "bilinear": DALIInterpType.INTERP_LINEAR,
    "bicubic": DALIInterpType.INTERP_CUBIC,
    "nearest": DALIInterpType.INTERP_NN,
    "lanczos": DALIInterpType.INTERP_LANCZOS3,
    "triangular": DALIInterpType.INTERP_TRIANGULAR,  # NVIDIA --interpolation triangular (DALI only)
}

# nvJPEG buffer paddings of NVIDIA's HybridTrainPipe, sized for full ImageNet so they never reallocate.
DEVICE_MEMORY_PADDING = 211025920
HOST_MEMORY_PADDING = 140544512


# DALI's stubs type every operator's result `DataNode | Sequence[DataNode] | None`, whatever it returns: these
# name what the operator gives (one node; the nodes of num_outputs > 1; a TFRecord reader's features).
def _one(result: DataNode | Sequence[DataNode] | None) -> DataNode:
    return cast(DataNode, result)


def _many(result: DataNode | Sequence[DataNode] | None) -> Sequence[DataNode]:
    return cast(Sequence[DataNode], result)


def _features(result: DataNode | Sequence[DataNode] | None) -> dict[str, DataNode]:
    return cast(dict[str, DataNode], result)


def interp_type(name: str) -> Any:
    if name not in INTERPOLATION:
        raise ConfigError(f"data.interpolation={name} is not supported by DALI; allowed: {', '.join(INTERPOLATION)}")
    return INTERPOLATION[name]


def _finish(images: Any, mirror: Any, settings: DaliSettings, to_device: bool = False) -> Any:
    """The batch as it leaves the pipeline, in settings.layout, flipped where `mirror` says. dali_gpu: normalized
    float (or fp16) by CMN on the GPU, as NVIDIA's pipelines. dali_cpu: uint8, normalized on the training device
    (DaliBackend.on_device, data/device_normalize.py), as NVIDIA's dali-cpu pipeline (CMN on the GPU after
    `.gpu()`): a float32 batch made on the host is 4x the bytes to make, hold and copy, and host cores are what
    dali_cpu runs short of. `to_device` (dali_cpu training on a CUDA device: settings.Delivery.pipeline_copies):
    the uint8 crops go to the GPU by DALI's `.gpu()`, as NVIDIA's, from DALI's pinned buffers on DALI's stream,
    and the layout and flip run there, off the host cores; the bytes copied are the same uint8 pixels."""
    if to_device:
        images = images.gpu()
    if not settings.gpu:
        return fn.crop_mirror_normalize(images, dtype=DALIDataType.UINT8, output_layout=settings.layout, mirror=mirror)
    # CMN takes 0-255 statistics (NVIDIA multiplies the ImageNet constants by 255 too).
    return fn.crop_mirror_normalize(
        images,
        dtype=DALIDataType.FLOAT16 if settings.fp16 else DALIDataType.FLOAT,
        output_layout=settings.layout,
        mean=[m * 255 for m in settings.mean],
        std=[s * 255 for s in settings.std],
        mirror=mirror,
    )


def _placeholder() -> np.ndarray:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (124, 116, 104)).save(buffer, "JPEG")
    return np.frombuffer(buffer.getvalue(), np.uint8)


PLACEHOLDER = _placeholder()  # what the decoder gets instead of a bad file; the loader drops it
_GOOD, _BAD = np.zeros(1, np.uint8), np.ones(1, np.uint8)


def check_encoded(batch: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(files, bad flags): each bad file (image_scan.scan_bytes) replaced by PLACEHOLDER and flagged 1.

    Module level, as fn.python_function requires under conditionals. Called once per batch; a plain JPEG
    costs microseconds (image_scan.scan_bytes), against milliseconds for its decode.
    """
    files, flags = [], []
    for data in batch:
        bad = scan_bytes(data) is not None
        files.append(PLACEHOLDER if bad else data)
        flags.append(_BAD if bad else _GOOD)
    return files, flags


def check_tfrecord(
    jpegs: list[np.ndarray], infos: list[np.ndarray], labels: list[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """(checked files, keys, bad flags) of a TFRecord batch: check_encoded plus the records' keys."""
    files, flags = check_encoded(jpegs)
    return files, records.tfrecord_keys(infos, labels), flags


def check_webdataset(
    jpegs: list[np.ndarray], infos: list[np.ndarray], cls: list[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """As check_tfrecord, for a WebDataset batch (the label is the `.cls` member's text)."""
    files, flags = check_encoded(jpegs)
    return files, records.webdataset_keys(infos, cls), flags


def crop_spec_values(spec: DistortedCrop) -> list[float]:
    return [*spec.area_range, *spec.aspect_range, spec.min_object_covered, spec.max_attempts]


def tf_windows(
    shapes: list[np.ndarray], uniforms: list[np.ndarray], specs: list[np.ndarray], *boxes: list[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(anchors, shapes) in pixels (H, W) of TF's crops of a batch: tf_crop.sample_windows, one call per batch
    (a per-sample python_function is a call an image, each holding the GIL: docs/data-backends.md "TF crop").
    `specs`: the DistortedCrop as crop_spec_values' numbers (a DALI constant: a module-level function takes no
    bound arguments under conditionals); `boxes`: the records' ymin, xmin, ymax, xmax lists, or none (the
    whole image)."""
    area_lo, area_hi, aspect_lo, aspect_hi, covered, attempts = (float(v) for v in specs[0])
    crop = DistortedCrop((area_lo, area_hi), (aspect_lo, aspect_hi), covered, int(attempts))
    sizes = np.stack(shapes)
    windows = sample_windows(
        sizes[:, 0], sizes[:, 1], crop, np.stack(uniforms), _record_boxes(boxes) if boxes else None
    )
    windows = windows.astype(np.int32)
    return list(windows[:, :2]), list(windows[:, 2:])


def _record_boxes(coordinates: tuple[list[np.ndarray], ...]) -> np.ndarray:
    """(B, K, 4) [ymin, xmin, ymax, xmax] boxes from the records' four lists of coordinates, one array an image
    each (tf_crop.padded_boxes: a record without boxes is the whole image). A record whose four lists differ in
    length keeps as many boxes as its shortest list, as the torchvision backend's reader (tfrecord.decode_example).
    A record without the lists comes as DALI's scalar default (VarLenFeature's 0.0): no boxes either."""
    sides = [[np.asarray(c, np.float32) for c in side] for side in coordinates]
    sides = [[c.reshape(-1) if c.ndim else np.zeros(0, np.float32) for c in side] for side in sides]
    sizes = np.array([[len(c) for c in side] for side in sides])  # (4, B)
    counts = sizes.min(axis=0)
    if (sizes == counts).all() and counts.min() == counts.max() > 0:  # as many boxes in every record: no padding
        return np.stack([np.concatenate(side) for side in sides], 1).reshape(len(counts), int(counts[0]), 4)
    return padded_boxes(
        [np.stack([side[i][:n] for side in sides], 1) if n else None for i, n in enumerate(counts.tolist())]
    )


@dataclass(frozen=True)
class FolderSource:
    """An image folder: DALI's file reader over a `file_list` of "path index" lines (FileList.write_list)."""

    file_list: str
    file_root: str | None


@dataclass(frozen=True)
class ShardSource:
    """Shard files (data.format=tfrecord|webdataset), local paths in reading order; TFRecord index files."""

    format: str
    paths: tuple[str, ...]
    index_paths: tuple[str, ...] = ()
    initial_fill: int = records.SHUFFLE_FILL


def _read_rank_part(
    source: FolderSource | ShardSource, shard_id: int, num_shards: int, training: bool, object_boxes: bool = False
) -> tuple[Any, Any, Any, list[Any] | None]:
    """(checked files, keys, bad flags, object boxes) of this rank's part of the samples (DALI's shard_id of
    num_shards), the only part of the pipelines that differs between data formats. A key is the sample index
    for a folder (the loader maps it to its class) and (shard path hash, byte offset, stored label) for shard
    files (records.py). object_boxes: TFRecords' image/object/bbox/{ymin,xmin,ymax,xmax} (TF1's crop), four
    float lists; None where the format has none."""
    if isinstance(source, FolderSource):
        return (*_read_folder(source, shard_id, num_shards, training), None)
    return _read_records(source, shard_id, num_shards, training, object_boxes)


def _read_folder(source: FolderSource, shard_id: int, num_shards: int, training: bool) -> tuple[Any, Any, Any]:
    """Train reshuffles the whole list before every epoch (shuffle_after_epoch: a permutation with a fixed
    seed per epoch, the same on every rank, so the ranks' parts stay disjoint; the list file itself comes
    permuted by the run seed) and each rank reads its part of it in that order. No `random_shuffle`: its
    1,024-file buffer of encoded JPEGs (`initial_fill`) cost 110 MB per rank and shuffled less (docs/
    data-backends.md "Startup"). Train pads instead of reading into the next epoch, so every epoch starts at
    the part's beginning. Val is exact: no padding duplicates, each rank keeps its own part every epoch,
    and the iterator's PARTIAL policy trims the samples read past the part's end. `file_list` holds "path
    index" lines (file_list.FileList.write_list): the reader's label is the sample index. dont_use_mmap: a
    zero-byte file cannot be mapped, and the reader would stop the pipeline on it before the check sees it."""
    jpegs, index = fn.readers.file(
        file_list=source.file_list,
        file_root=source.file_root,
        shard_id=shard_id,
        num_shards=num_shards,
        shuffle_after_epoch=training,  # implies stick_to_shard (DALI refuses both set)
        pad_last_batch=training,
        stick_to_shard=not training,
        dont_use_mmap=True,
        name=READER,
    )
    jpegs, bad = _many(fn.python_function(jpegs, function=check_encoded, num_outputs=2, batch_processing=True))
    return jpegs, index, bad


def _read_records(
    source: ShardSource, shard_id: int, num_shards: int, training: bool, object_boxes: bool = False
) -> tuple[Any, Any, Any, list[Any] | None]:
    """DALI's own readers of shard files. Each rank reads its contiguous range of the records (DALI splits the
    records of all files, in the order given, at floor(r * N / W)) and keeps it every epoch
    (stick_to_shard): ranks never read the same record. These readers have no shuffle_after_epoch: train
    draws from a shuffle buffer of `initial_fill` records (records.SHUFFLE_FILL, why that size) and pads the
    shorter parts, so every rank counts N // W records an epoch; val reads in order, without padding, and
    the iterator's PARTIAL policy trims what it read past the part's end, as for a folder."""
    common: dict[str, Any] = {
        "shard_id": shard_id,
        "num_shards": num_shards,
        "random_shuffle": training,
        "stick_to_shard": True,
        "pad_last_batch": training,
        "dont_use_mmap": True,
        "name": READER,
    }
    if training:
        common["initial_fill"] = int(source.initial_fill)
    check: Callable[..., Any]  # check_tfrecord or check_webdataset: their label arguments are named apart
    if source.format == "tfrecord":
        features = {
            IMAGE_KEY: tfrec.FixedLenFeature([], tfrec.string, ""),  # missing: empty bytes, a bad record
            LABEL_KEY: tfrec.FixedLenFeature([1], tfrec.int64, -1),  # missing: -1, outside every label base
        }
        if object_boxes:  # empty lists: no box, the whole image is the box (a missing list: see _record_boxes)
            features.update({key: tfrec.VarLenFeature(tfrec.float32, 0.0) for key in BOX_KEYS})
        outputs = _features(
            fn.readers.tfrecord(
                path=list(source.paths), index_path=list(source.index_paths), features=features, **common
            )
        )
        jpegs, stored, check = outputs[IMAGE_KEY], outputs[LABEL_KEY], check_tfrecord
        boxes = [outputs[key] for key in BOX_KEYS] if object_boxes else None
    else:
        # Alternatives of one component are ';'-separated; a sample without an image or a label stops
        # the reader naming the tar (DALI's error, raised through the loader).
        images = ";".join(IMAGE_EXTENSIONS)
        jpegs, stored = _many(
            fn.readers.webdataset(
                paths=list(source.paths), ext=[images, LABEL_EXTENSION], missing_component_behavior="error", **common
            )
        )
        check, boxes = check_webdataset, None
    info = fn.get_property(jpegs, key="source_info")
    jpegs, key, bad = _many(
        fn.python_function(jpegs, info, stored, function=check, num_outputs=3, batch_processing=True)
    )
    return jpegs, key, bad, boxes


@pipeline_def(enable_conditionals=True)  # conditionals: required by DALI's auto_aug policies (the backend turns them
# off when no policy runs: data/dali/backend.py)
def train_pipeline(
    *,
    source: FolderSource | ShardSource,
    settings: DaliSettings,
    shard_id: int,
    num_shards: int,
    size: int,
    randaugment: tuple[int, int] = (2, 9),
    host_resize: bool = False,
    to_device: bool = False,
) -> Any:
    """`source`: what to read; `shard_id` of `num_shards`: this rank's part of it. Outputs (images, index,
    bad[, crop shape]) (crop shape: settings.with_crop_shape). host_resize: stop after the ROI decode and return
    (crops, index, bad, mirror[, crop shape]); the loader resizes, flips and normalizes in torch (host_resize.py:
    DALI's CPU resize is slow). settings.tf_crop: TF's sample_distorted_bounding_box with these arguments instead
    of DALI's random crop (crop_scale, crop_ratio unused); object_boxes: against the TFRecords' object boxes (TF1),
    else the whole image (TF2). to_device: the images output on the pipeline's GPU (_finish)."""
    tf_crop = settings.tf_crop
    boxed = settings.object_boxes  # tf_crop.uses_object_boxes: only with data.train_crop=tf
    jpegs, index, bad, boxes = _read_rank_part(source, shard_id, num_shards, True, boxed)
    decoder_args: dict[str, Any] = {
        "device": "mixed" if settings.gpu else "cpu",
        "output_type": DALIImageType.RGB,
    }
    if settings.gpu:
        decoder_args |= {"device_memory_padding": DEVICE_MEMORY_PADDING, "host_memory_padding": HOST_MEMORY_PADDING}
    if tf_crop is not None:
        # TF's random numbers come from DALI (seeded with the pipeline, in its checkpoints); the window is
        # chosen in Python from the encoded image's size, and only that window is decoded.
        uniforms = fn.random.uniform(range=[0.0, 1.0], shape=[tf_crop.max_attempts, UNIFORMS_PER_ATTEMPT])
        spec = types.Constant(np.array(crop_spec_values(tf_crop), np.float32))
        inputs = [fn.peek_image_shape(jpegs), uniforms, spec, *(boxes or [])]
        anchor, extent = _many(fn.python_function(*inputs, function=tf_windows, num_outputs=2, batch_processing=True))
        images = fn.decoders.image_slice(
            jpegs, anchor, extent, axis_names="HW", normalized_anchor=False, normalized_shape=False, **decoder_args
        )
    else:
        images = fn.decoders.image_random_crop(
            jpegs,
            random_area=list(settings.crop_scale),
            random_aspect_ratio=list(settings.crop_ratio),
            num_attempts=100,
            **decoder_args,
        )
    crop_shape = images.shape() if settings.with_crop_shape else None  # (h, w, c) of each crop, for tests
    mirror = fn.random.coin_flip(probability=float(settings.hflip))
    if host_resize:
        return (images, index, bad, mirror, crop_shape) if settings.with_crop_shape else (images, index, bad, mirror)
    # antialias=False in training, as NVIDIA (6fcd5f5d "Fix DALI anti-alias flag"): cheaper on CPU.
    interpolation = interp_type(settings.interpolation)
    images = _one(fn.resize(images, size=[size, size], interp_type=interpolation, antialias=settings.antialias))
    augment = settings.augment
    if augment == "autoaugment":
        # DALI's image_net policy is v0 (the sub-policies of NVIDIA's PYT IC/autoaugment.py and TF2 policy_v0),
        # here with the Posterize, Solarize and warps of data.autoaugment_ops (tf_autoaugment.py), as the
        # torchvision backend (augment.py). Translations in pixels as NVIDIA's (up to 250 px); with `shape` DALI
        # would shift up to the whole image.
        policy = v0_policy(max_translate_abs=AUTOAUGMENT_TRANSLATE_PIXELS, ops=settings.autoaugment_ops)
        images = nvidia_auto_augment(images, policy)
    elif augment == "randaugment":
        n, m = randaugment
        # timm magnitudes run 0..10, so 11 bins make DALI's bin m the same strength as timm's m.
        images = rand_augment.rand_augment(images, n=n, m=m, num_magnitude_bins=11, shape=(size, size))
    images = _finish(images, mirror, settings, to_device)
    if settings.with_crop_shape:
        return images, index, bad, crop_shape
    return images, index, bad


@pipeline_def
def val_pipeline(
    *,
    source: FolderSource | ShardSource,
    settings: DaliSettings,
    shard_id: int,
    num_shards: int,
    size: int,
    resize: int,
    to_device: bool = False,
) -> Any:
    """`resize`: the shorter side before the centre crop of `size` (transforms.val_resize_size); `to_device`: the
    images output on the pipeline's GPU (_finish)."""
    jpegs, index, bad, _ = _read_rank_part(source, shard_id, num_shards, training=False)
    images = fn.decoders.image(jpegs, device="mixed" if settings.gpu else "cpu", output_type=DALIImageType.RGB)
    # The geometry of torchvision's Resize(resize) + CenterCrop(size) (transforms.val_resize_size), to the pixel:
    # the longer side truncated, the crop anchor rounded half to even (Python's round). DALI's own
    # resize_shorter and centred crop round differently, a one-pixel shift on most photos.
    shape = fn.peek_image_shape(jpegs)
    height, width = fn.cast(shape[0], dtype=DALIDataType.INT32), fn.cast(shape[1], dtype=DALIDataType.INT32)
    shorter = dmath.min(height, width)
    scaled = int(resize)
    new_h, new_w = (scaled * height) // shorter, (scaled * width) // shorter
    images = _one(
        fn.resize(
            images,
            resize_y=fn.cast(new_h, dtype=DALIDataType.FLOAT),
            resize_x=fn.cast(new_w, dtype=DALIDataType.FLOAT),
            interp_type=interp_type(settings.interpolation),
            antialias=True,
        )
    )
    anchor = fn.stack(_half_to_even(new_h - size), _half_to_even(new_w - size))
    images = fn.slice(images, start=anchor, shape=[size, size], axis_names="HW")
    return _finish(images, 0, settings, to_device), index, bad


def _half_to_even(diff: Any) -> Any:
    """round(diff / 2) with ties to even, in DALI integer arithmetic."""
    half = diff // 2
    return half + (diff - 2 * half) * (half - 2 * (half // 2))
