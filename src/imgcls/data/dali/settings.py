"""DaliSettings: the data config as DALI's pipelines and loader read it, checked and converted once per backend
(DaliBackend), so that the pipelines and the loader take one value instead of a parameter per config key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from imgcls.data.augment import parse_randaugment
from imgcls.data.tf_crop import DistortedCrop, crop_spec, uses_object_boxes


@dataclass(frozen=True)
class DaliSettings:
    """Every data.* value the DALI backend uses. `with_crop_shape` is a pipeline option with no config key: each
    train crop's (h, w, c) as a further output of the loader, for tests of the crop geometry."""

    gpu: bool  # dali_gpu: nvJPEG decode and GPU resize; dali_cpu never touches CUDA
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
    def from_config(cls, cfg: Any, gpu: bool) -> DaliSettings:
        """The settings of data config CFG; a value DALI cannot take is a one-line ConfigError (an interpolation
        DALI lacks: pipelines.interp_type, which the backend calls)."""
        randaugment = parse_randaugment(str(cfg.randaugment)) if cfg.augment == "randaugment" else (2, 9)
        return cls(
            gpu=gpu,
            image_size=int(cfg.image_size),
            interpolation=str(cfg.interpolation),
            mean=tuple(float(m) for m in cfg.mean),
            std=tuple(float(s) for s in cfg.std),
            channels_last=bool(cfg.get("channels_last")),
            fp16=bool(cfg.get("dali_fp16")),
            num_threads=max(1, int(cfg.num_workers)),
            prefetch_queue_depth=max(1, int(cfg.prefetch_factor or 2)),
            pin_memory=bool(cfg.get("pin_memory")),
            crop_scale=tuple(float(v) for v in cfg.train_crop_scale),
            crop_ratio=tuple(float(v) for v in cfg.train_crop_ratio),
            hflip=float(cfg.hflip),
            antialias=bool(cfg.get("dali_train_antialias")),
            augment=cfg.augment,
            randaugment=(int(randaugment[0]), int(randaugment[1])),
            tf_crop=crop_spec(cfg) if cfg.get("train_crop") == "tf" else None,
            object_boxes=uses_object_boxes(cfg),
            train_resize=str(cfg.get("dali_train_resize") or "auto"),
            resize_threads=int(cfg.get("dali_resize_threads") or 1),  # 0 or 1: one thread
            host_prefetch=int(cfg.get("dali_host_prefetch", 1)),
            reader_positions=bool(cfg.get("dali_checkpointing", True)),
            trace_dir=str(cfg.trace_dir) if cfg.get("trace_dir") else None,
        )

    def saves_reader_position(self, split: str) -> bool:
        """Whether SPLIT's reader saves its position: train's, unless data.dali_checkpointing=false (val never
        resumes)."""
        return split == "train" and self.reader_positions

    @property
    def layout(self) -> str:
        return "HWC" if self.channels_last else "CHW"
