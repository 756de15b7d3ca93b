"""Random tensors of the model's input size, for throughput runs (NVIDIA --data-backend synthetic)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class SyntheticImages(Dataset):
    """Deterministic random images and labels; index i always yields the same sample."""

    def __init__(self, num_samples: int, image_size: int, num_classes: int, seed: int = 0) -> None:
        self.num_samples = num_samples
        self.image_size = image_size
        self.num_classes = num_classes
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        image = torch.randn(3, self.image_size, self.image_size, generator=g)
        return image, int(torch.randint(self.num_classes, (1,), generator=g))
