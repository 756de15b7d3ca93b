"""dali_cpu's train resize on the host: DALI reads, shards, shuffles, ROI-decodes the random crop and
draws the flips; torch resizes each uint8 crop to the training size, flips and normalizes.

Why not `fn.resize`: on the CPU, DALI's resampler is the most expensive stage of the pipeline. On an
ImageNet crop it takes 0.74 core-ms, 65% of what the ROI decode costs (2-core EPYC, imagenet-samples-500).
torch's uint8 resize kernels (AVX2, channels_last) do the same bilinear resize in 0.28 ms. The whole
pipeline went from 0.78x to 1.05x of a plain JPEG decode (docs/data-backends.md). Hand-written,
because no library offers "DALI decode, torch resize". DALI's own ragged iterator still owns the epoch,
shard and last-batch logic.

The loader (dali.DaliLoader) calls HostResize in a background thread that makes batch N+1 while the
training step runs on batch N (`data.dali_host_prefetch`, default 1; 0 resizes inside the step).

`data.dali_train_resize` chooses: `auto`, `torch`, or `dali` (NVIDIA's pipeline). `auto` is torch on
dali_cpu for train sizes of at least 128 px (every ImageNet recipe), unless a DALI AutoAugment/RandAugment
policy or an interpolation torch lacks needs DALI's resize. Below 128 px torch's per-image Python
overhead (~0.3 ms) outweighs the pixel work: on 32x32 CIFAR JPEGs DALI's resize ran 1.3-2x faster at
32-96 px, torch's 1.3x faster at 224. dali_gpu always resizes on the GPU, where DALI's resize is fast.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from imgcls.errors import ConfigError

TORCH_MODES = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest"}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h
AUTO_MIN_SIZE = 128  # auto: torch from this train size up (see above)


def resize_on_host(choice: str, gpu: bool, augment: str | None, interpolation: str, size: int = 224) -> bool:
    """Whether the train resize runs in torch (True) or in the DALI pipeline (False)."""
    if choice not in ("auto", "torch", "dali"):
        raise ConfigError(f"data.dali_train_resize={choice} is not allowed; use auto, torch or dali")
    if choice == "dali" or gpu:
        return False
    if choice == "torch":
        if augment:
            raise ConfigError(
                f"data.dali_train_resize=torch cannot run data.augment={augment} (a DALI policy applied after "
                "DALI's resize); use data.dali_train_resize=dali or auto"
            )
        if interpolation not in TORCH_MODES:
            raise ConfigError(
                f"data.dali_train_resize=torch has no {interpolation} resize; "
                f"use data.interpolation={'|'.join(TORCH_MODES)} or data.dali_train_resize=dali"
            )
        return True
    return not augment and interpolation in TORCH_MODES and size >= AUTO_MIN_SIZE


@functools.cache  # once per process
def keep_freed_memory() -> None:
    """Stop glibc from unmapping freed blocks over 32 MiB.

    A batch of 64x3x224x224 floats is 38.5 MB, over glibc's largest adaptive mmap threshold, so every
    batch is a fresh mmap and page-faults in its memory again: 0.3 ms an image here, a third of the
    pipeline. The same tuning as MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_, or what PyTorch's CPU
    tuning guide gets from jemalloc/tcmalloc. A no-op off glibc."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, 1 << 30)
        mallopt(_M_TRIM_THRESHOLD, 1 << 30)


class HostResize:
    """Variable-size uint8 HWC crops -> one normalized (N, 3, size, size) batch."""

    def __init__(
        self,
        size: int,
        interpolation: str,
        antialias: bool,
        mean: Sequence[float],
        std: Sequence[float],
        fp16: bool = False,
        pin_memory: bool = False,
        threads: int = 1,
    ) -> None:
        self.size = int(size)
        # torch releases the GIL in its kernels, so threads resize in parallel. One thread would cap a
        # process at about 2,500 img/s at 224 px: enough for 2 cores, not for the 16 cores a DGX gives a GPU.
        self.threads = max(1, int(threads))
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="imgcls-resize") if self.threads > 1 else None
        mode = TORCH_MODES[interpolation]
        # torch antialiases only the bilinear/bicubic modes (it refuses antialias=True for nearest)
        self.resize_args = {"mode": mode, "antialias": bool(antialias) and mode != "nearest"}
        self.dtype = torch.float16 if fp16 else torch.float32
        # x * (1/std) + (-mean/std): one multiply-add per value, in 0-255 units like CMN.
        self.scale = (1.0 / (torch.tensor(std) * 255)).view(3, 1, 1).to(self.dtype)
        self.shift = (-torch.tensor(mean) / torch.tensor(std)).view(3, 1, 1).to(self.dtype)
        # Pinned batches come from CUDA's caching host allocator, which also reuses them safely.
        self.pin_memory = pin_memory and torch.cuda.is_available()
        if not self.pin_memory:
            keep_freed_memory()

    def __call__(self, crops: Sequence[torch.Tensor], mirror: torch.Tensor) -> torch.Tensor:
        """Always NCHW, also for channels_last models: torch's resize writes NCHW, a 3-channel transpose
        costs 0.2 ms an image here, and the module converts on the device (free on a GPU)."""
        size = self.size
        batch = torch.empty((len(crops), 3, size, size), dtype=self.dtype, pin_memory=self.pin_memory)
        flips = mirror.reshape(-1).tolist()
        if self.pool is None:
            self._fill(batch, crops, flips, range(len(crops)))
        else:  # interleaved shares, so that large and small crops spread evenly
            shares = [range(k, len(crops), self.threads) for k in range(self.threads)]
            list(self.pool.map(lambda share: self._fill(batch, crops, flips, share), shares))
        return batch

    def _fill(self, batch: torch.Tensor, crops: Sequence[torch.Tensor], flips: list[int], share: range) -> None:
        size = self.size
        for i in share:
            image = crops[i].permute(2, 0, 1).unsqueeze(0)  # HWC -> 1CHW view with NHWC strides: no copy
            image = F.interpolate(image, size=(size, size), **self.resize_args)[0]
            if flips[i]:
                image = image.flip(-1)
            # Normalized one image at a time, while it is still in cache.
            batch[i].copy_(image).mul_(self.scale).add_(self.shift)
