"""DaliSettings: the data config as DALI's pipelines and loader read it, checked and converted once per backend
(DaliBackend), so that the pipelines and the loader take one value instead of a parameter per config key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from imgcls.data.augment import parse_randaugment
from imgcls.data.tf_crop import DistortedCrop, crop_spec, uses_object_boxes

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema


@dataclass(frozen=True)
class Delivery:
    """How one loader's batches reach its training device (DaliSettings.delivery).

    `device_id`: the pipeline's CUDA device (DALI's device_id); None: the pipeline never touches CUDA, so dali_cpu
    runs on machines without a GPU. `pipeline_copies`: dali_cpu's pipeline ends in `.gpu()`, as NVIDIA's dali-cpu
    pipeline: DALI copies the uint8 batch from its own pinned buffers, on its own stream, `prefetch_queue_depth`
    batches ahead, and the layout and flip (crop_mirror_normalize) run on the GPU. `pinned_resize`: the torch
    resize writes its batches into pinned memory (data.pin_memory, as the torchvision DataLoader). `side_stream`:
    the loader copies what is still on the host (the torch resize's batch, the labels) on a side stream, in the
    thread that made the batch (device_prefetch.CudaCopies), and the compute stream waits for that copy only."""

    device_id: int | None
    pipeline_copies: bool
    pinned_resize: bool
    side_stream: bool


@dataclass(frozen=True)
class DaliSettings:
    """Every data.* value the DALI backend uses. `with_crop_shape` is a pipeline option with no config key: each
    train crop's (h, w, c) as a further output of the loader, for tests of the crop geometry."""

    gpu: bool  # dali_gpu: nvJPEG decode and GPU resize; dali_cpu touches CUDA only for a CUDA training device
    image_size: int
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    channels_last: bool  # CMN writes HWC and the loader returns an NCHW view with NHWC strides
    fp16: bool
    num_threads: int
    prefetch_queue_depth: int
    pin_memory: bool
    # train
    crop_scale: tuple[float, ...]
    crop_ratio: tuple[float, ...]
    hflip: float
    antialias: bool  # train resize antialias (NVIDIA: off, cheaper on CPU)
    augment: str | None
    autoaugment_ops: str  # data.autoaugment_ops: NVIDIA's tf2 or pytorch ops (tf_autoaugment.py)
    randaugment: tuple[int, int]  # (ops, magnitude); (2, 9) unless data.augment=randaugment
    tf_crop: DistortedCrop | None  # data.train_crop=tf: TF's sample_distorted_bounding_box (data/tf_crop.py)
    object_boxes: bool
    train_resize: str  # data.dali_train_resize: auto|torch|dali (host_resize.resize_on_host)
    resize_threads: int  # the torch resize's threads (0 or 1: one)
    host_prefetch: int  # batches the torch resize makes ahead in its thread (0: no thread)
    reader_positions: bool  # the train reader saves its position, DALI's checkpoint (a resume at the exact batch)
    trace_dir: str | None  # data.trace_dir: the samples each rank read, per epoch
    with_crop_shape: bool = False

    @classmethod
    def from_config(cls, cfg: DataSchema, gpu: bool) -> DaliSettings:
        """The settings of data config CFG; a value DALI cannot take is a one-line ConfigError (an interpolation
        DALI lacks: pipelines.interp_type, which the backend calls)."""
        randaugment = parse_randaugment(str(cfg.randaugment)) if cfg.augment == "randaugment" else (2, 9)
        return cls(
            gpu=gpu,
            image_size=int(cfg.image_size),
            interpolation=str(cfg.interpolation),
            mean=tuple(float(m) for m in cfg.mean),
            std=tuple(float(s) for s in cfg.std),
            channels_last=cfg.channels_last,
            fp16=cfg.dali_fp16,
            num_threads=max(1, int(cfg.num_workers)),
            # data.prefetch_factor=null is PyTorch's default, 2 batches: DALI's default queue depth too.
            prefetch_queue_depth=2 if cfg.prefetch_factor is None else max(1, cfg.prefetch_factor),
            pin_memory=cfg.pin_memory,
            crop_scale=tuple(float(v) for v in cfg.train_crop_scale),
            crop_ratio=tuple(float(v) for v in cfg.train_crop_ratio),
            hflip=float(cfg.hflip),
            antialias=cfg.dali_train_antialias,
            augment=cfg.augment,
            autoaugment_ops=str(cfg.autoaugment_ops),
            randaugment=(int(randaugment[0]), int(randaugment[1])),
            tf_crop=crop_spec(cfg) if cfg.train_crop == "tf" else None,
            object_boxes=uses_object_boxes(cfg),
            train_resize=str(cfg.dali_train_resize),
            resize_threads=max(1, cfg.dali_resize_threads),  # 0 or 1: one thread
            host_prefetch=int(cfg.dali_host_prefetch),
            reader_positions=bool(cfg.dali_checkpointing),
            trace_dir=str(cfg.trace_dir) if cfg.trace_dir else None,
        )

    def delivery(self, device: torch.device | None, host_resize: bool) -> Delivery:
        """How the batches of a loader for DEVICE (LoaderSpec.device) reach it; `host_resize`: the loader resizes in
        torch (host_resize.resize_on_host). A CUDA device: every batch from pinned memory and off the compute
        stream. Where DALI resizes (its fn.resize, the augment policies, validation), DALI's own `.gpu()` copies
        the batch: it allocates the pipeline's buffers pinned, where pinning them in the loader would be one more
        copy of the batch on the host cores dali_cpu runs short of. The torch resize writes the batch itself, so
        it writes it pinned. Elsewhere (a CPU run, evaluate's own loop) dali_cpu leaves CUDA alone."""
        cuda = device is not None and device.type == "cuda"
        copies = cuda and not self.gpu and not host_resize
        device_id = None
        if self.gpu or copies:
            index = device.index if cuda and device is not None else None
            device_id = int(index) if index is not None else torch.cuda.current_device()
        return Delivery(device_id, copies, cuda and host_resize and self.pin_memory, cuda)

    def saves_reader_position(self, split: str) -> bool:
        """Whether SPLIT's reader saves its position: train's, unless data.dali_checkpointing=false (val never
        resumes)."""
        return split == "train" and self.reader_positions

    @property
    def layout(self) -> str:
        return "HWC" if self.channels_last else "CHW"
