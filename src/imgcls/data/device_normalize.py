"""Batches leave the loader workers as uint8 and are made float, normalized and channels_last on the device.

NVIDIA's PyTorch loader does the same (image_classification/dataloaders.py: `fast_collate` to uint8, then
`PrefetchedWrapper` normalizes on the GPU), and so does timm's PrefetchLoader: a float32 batch made in the
workers is 4x the bytes to collate, pin and copy, for arithmetic the GPU does in microseconds. DALI and
synthetic batches arrive normalized on the device already and pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class DeviceNormalize:
    """(uint8 NCHW images) -> float32 ((x / 255 - mean) / std), channels_last when the network runs it.

    The three steps are torchvision's ToTensor then Normalize, op for op, so a batch equals what the workers
    made when they normalized (bitwise on CPU). The constants are copied to each device once, not per batch
    (a copy from pageable memory waits for the device's queue)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], channels_last: bool = False) -> None:
        self.mean = torch.tensor([float(m) for m in mean]).view(1, -1, 1, 1)
        self.std = torch.tensor([float(s) for s in std]).view(1, -1, 1, 1)
        self.channels_last = bool(channels_last)
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8:
            return images
        if images.device not in self._constants:
            self._constants[images.device] = (self.mean.to(images.device), self.std.to(images.device))
        mean, std = self._constants[images.device]
        layout = torch.channels_last if self.channels_last and images.dim() == 4 else torch.contiguous_format
        return images.to(dtype=torch.float32, memory_format=layout).div_(255).sub_(mean).div_(std)
