"""dali_cpu's train resize on the host: DALI reads its rank's part, shuffles, ROI-decodes the random crop and
draws the flips; torch resizes each uint8 crop to the training size and flips it into a uint8 batch (normalized
on the training device, as every dali_cpu batch: pipelines._finish).

Why not `fn.resize`: on the CPU, DALI's resampler is the most expensive stage of the pipeline, and torch's
uint8 resize kernels (AVX2, channels_last) do the same bilinear resize in well under half its time
(measured: docs/data-backends.md "Why dali_cpu resizes in torch"). Hand-written, because no library offers
"DALI decode, torch resize". DALI's own ragged iterator still owns the epoch,
rank-part and last-batch logic.

The loader (loader.DaliLoader) calls HostResize in a background thread that makes batch N+1 while the
training step runs on batch N (`data.dali_host_prefetch`, default 1; 0 resizes inside the step).

Batches are written into the loader's ring of batch buffers (batch_ring.py), not into fresh memory each time;
the loader's queue defines how long a batch stays intact (loader.ring_slots). For a CUDA training device with
data.pin_memory (settings.Delivery.pinned_resize) they are written pinned instead, and the loader's thread queues
their copy on a side stream as soon as each is written (loader.DaliLoader `copier`), not Lightning on the
compute stream when the step starts.

`data.dali_train_resize` chooses: `auto`, `torch`, or `dali` (NVIDIA's pipeline). `auto` is torch on
dali_cpu for train sizes of at least 128 px (every ImageNet recipe), unless a DALI AutoAugment/RandAugment
policy or an interpolation torch lacks needs DALI's resize. Below 128 px torch's per-image Python
overhead outweighs the pixel work (measured on CIFAR, same docs section). dali_gpu always resizes on the
GPU, where DALI's resize is fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.nn.functional as F

from imgcls.config.choices import HOST_RESIZE_MODES
from imgcls.data.dali.batch_ring import BatchRing

AUTO_MIN_SIZE = 128  # auto: torch from this train size up (see above)


def resize_on_host(choice: str, gpu: bool, augment: str | None, interpolation: str, size: int = 224) -> bool:
    """Whether the train resize runs in torch (True) or in the DALI pipeline (False)."""
    if choice == "dali" or gpu:
        return False
    if choice == "torch":  # config.checks refuses an augment or an interpolation that torch resize cannot run
        return True
    return not augment and interpolation in HOST_RESIZE_MODES and size >= AUTO_MIN_SIZE


class HostResize:
    """Variable-size uint8 HWC crops -> one uint8 (N, 3, size, size) batch."""

    def __init__(
        self,
        size: int,
        interpolation: str,
        antialias: bool,
        pin_memory: bool = False,
        threads: int = 1,
        ring: BatchRing | None = None,
    ) -> None:
        self.size = int(size)
        # torch releases the GIL in its kernels, so threads resize in parallel. One thread would cap a process's
        # rate: enough for 2 cores, not for the 16 cores a DGX gives a GPU (docs/data-backends.md).
        self.threads = max(1, int(threads))
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="imgcls-resize") if self.threads > 1 else None
        mode = interpolation  # HOST_RESIZE_MODES: data.interpolation names that are F.interpolate's modes
        # torch antialiases only the bilinear/bicubic modes (it refuses antialias=True for nearest)
        self.resize_args: dict[str, Any] = {"mode": mode, "antialias": bool(antialias) and mode != "nearest"}
        # Pinned batches come from CUDA's caching host allocator, which also reuses them safely (it waits for
        # the copies to the GPU): no ring. Without a ring, every batch is new memory.
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.ring = None if self.pin_memory else ring

    def __call__(self, crops: Sequence[torch.Tensor], mirror: torch.Tensor) -> torch.Tensor:
        """Always NCHW, also for channels_last models: torch's resize writes NCHW, a 3-channel transpose on the
        host is not free, and the module converts on the device (free on a GPU)."""
        size = self.size
        shape = (len(crops), 3, size, size)
        if self.ring is not None:
            batch = self.ring.take(shape, torch.uint8)
        else:
            batch = torch.empty(shape, dtype=torch.uint8, pin_memory=self.pin_memory)
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
            batch[i].copy_(image)
