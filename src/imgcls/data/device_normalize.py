"""Batches leave the loader workers as uint8 and are made float, normalized and channels_last on the device.

NVIDIA's PyTorch loader does the same (image_classification/dataloaders.py: `fast_collate` to uint8, then
`PrefetchedWrapper` normalizes on the GPU), and so does timm's PrefetchLoader: a float32 batch made in the
workers is 4x the bytes to collate, pin and copy, for arithmetic the GPU does in microseconds. dali_cpu's
batches are uint8 too (NVIDIA's dali-cpu pipeline also copies uint8 and normalizes on the GPU); dali_gpu's and
synthetic batches arrive normalized on the device already and pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class DeviceNormalize:
    """(uint8 NCHW images) -> float32 (or `dtype`) (x / 255 - mean) / std, channels_last when the network runs it.

    One kernel: addcmul(-mean / std, x, 1 / (255 std)) reads the uint8 batch and writes the float one (type
    promotion does the conversion), where convert-subtract-divide would pass over the float batch three times.
    It equals torchvision's ToTensor then Normalize to float rounding (a few ulps). The layout is set on the
    uint8 batch, a quarter of the bytes, and the output follows it. The constants are copied to each device once
    (a copy from pageable memory waits for the device's queue)."""

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        channels_last: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        mean_t = torch.tensor([float(m) for m in mean], dtype=torch.float64).view(1, -1, 1, 1)
        std_t = torch.tensor([float(s) for s in std], dtype=torch.float64).view(1, -1, 1, 1)
        # float32 constants and arithmetic for every output type, rounded once at the end (fp16 constants would
        # round twice, up to 2x the error of DALI's own fp16 normalization, which computes in float32).
        self.shift = (-mean_t / std_t).float()
        self.scale = (1.0 / (255.0 * std_t)).float()
        self.dtype = dtype
        self.channels_last = bool(channels_last)
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8:
            return images
        if images.device not in self._constants:
            self._constants[images.device] = (self.shift.to(images.device), self.scale.to(images.device))
        shift, scale = self._constants[images.device]
        if self.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        normalized = torch.addcmul(shift, images, scale)
        return normalized if self.dtype == torch.float32 else normalized.to(self.dtype)
