"""dali_cpu's train resize on the host: DALI reads its rank's part, shuffles, ROI-decodes the random crop and
draws the flips; torch resizes each uint8 crop to the training size, flips and normalizes.

Why not `fn.resize`: on the CPU, DALI's resampler is the most expensive stage of the pipeline, and torch's
uint8 resize kernels (AVX2, channels_last) do the same bilinear resize in well under half its time
(measured: docs/data-backends.md "Why dali_cpu resizes in torch"). Hand-written, because no library offers
"DALI decode, torch resize". DALI's own ragged iterator still owns the epoch,
rank-part and last-batch logic.

The loader (loader.DaliLoader) calls HostResize in a background thread that makes batch N+1 while the
training step runs on batch N (`data.dali_host_prefetch`, default 1; 0 resizes inside the step).

Batches are written into buffers that HostResize reuses once nothing else holds them (BatchBuffers): a new
38.5 MB batch (64x3x224x224 floats) was a fresh mmap from glibc that page-faulted in, 0.3 ms an image. This
replaces the process-wide glibc tuning used before (mallopt: keep every freed block), which also kept the
training step's freed activations: 90 MB more at the first step's peak on the startup benchmark
(docs/data-backends.md "Startup").

`data.dali_train_resize` chooses: `auto`, `torch`, or `dali` (NVIDIA's pipeline). `auto` is torch on
dali_cpu for train sizes of at least 128 px (every ImageNet recipe), unless a DALI AutoAugment/RandAugment
policy or an interpolation torch lacks needs DALI's resize. Below 128 px torch's per-image Python
overhead outweighs the pixel work (measured on CIFAR, same docs section). dali_gpu always resizes on the
GPU, where DALI's resize is fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from imgcls.errors import ConfigError

TORCH_MODES = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest"}
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


def _storage_users(tensor: torch.Tensor) -> int:
    """How many tensors share TENSOR's memory (views and aliases each count; autograd's saved tensors too)."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


class BatchBuffers:
    """Up to `count` batch buffers, each reused once no tensor other than the buffer holds its memory.

    A batch is handed out as a view of its buffer, so whatever keeps it (the training step, Lightning's
    prefetch, the loader's queue, autograd's saved input until the backward) keeps the buffer's storage
    count above the buffer's own, and the buffer is not written again until all of those are gone. When every
    buffer is in use the batch gets new memory, kept as a buffer only while fewer than `count` exist."""

    def __init__(self, count: int) -> None:
        self.count = max(0, int(count))
        self.buffers: list[torch.Tensor] = []
        # Without torch's storage use count (a private API) nothing can tell a free buffer: no reuse.
        self._own = _storage_users(torch.empty(1)) if hasattr(torch._C, "_storage_Use_Count") else None

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self._own is not None:
            for buffer in self.buffers:
                if buffer.dtype == dtype and buffer.shape[1:] == shape[1:] and len(buffer) >= shape[0]:
                    if _storage_users(buffer) <= self._own:
                        return buffer[: shape[0]]  # a view: the caller's reference counts
        batch = torch.empty(shape, dtype=dtype)
        if self._own is None or len(self.buffers) >= self.count:
            return batch
        self.buffers.append(batch)
        return batch[:]


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
        buffers: int = 4,
    ) -> None:
        self.size = int(size)
        # torch releases the GIL in its kernels, so threads resize in parallel. One thread would cap a process's
        # rate: enough for 2 cores, not for the 16 cores a DGX gives a GPU (docs/data-backends.md).
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
        self.buffers = BatchBuffers(0 if self.pin_memory else buffers)

    def __call__(self, crops: Sequence[torch.Tensor], mirror: torch.Tensor) -> torch.Tensor:
        """Always NCHW, also for channels_last models: torch's resize writes NCHW, a 3-channel transpose on the
        host is not free, and the module converts on the device (free on a GPU)."""
        size = self.size
        shape = (len(crops), 3, size, size)
        if self.pin_memory:
            batch = torch.empty(shape, dtype=self.dtype, pin_memory=True)
        else:
            batch = self.buffers.take(shape, self.dtype)
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
