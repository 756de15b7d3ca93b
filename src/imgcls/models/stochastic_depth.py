"""Stochastic depth as NVIDIA's PyTorch EfficientNets draw it: one Bernoulli for the whole batch.

timm's `DropPath` (and TF2's drop_connect) drops each sample's residual branch on its own. NVIDIA's PyTorch
`StochasticDepthResidual` (PyTorch/Classification/ConvNets/image_classification/models/common.py:281-298) draws
one scalar mask per forward pass, `F.dropout(ones(()), p=1 - survival_prob)`: the branch of every sample is kept
(scaled by 1/survival_prob) or the block is an identity for the whole batch. `model.drop_path_mask=batch`
swaps timm's DropPath modules for BatchDropPath after the network is built, keeping timm's per-block rates
(drop_path_rate x block index / blocks, NVIDIA's `_get_survival_prob`, models/efficientnet.py:284-287).
"""

from __future__ import annotations

import torch
from timm.layers import DropPath
from torch import nn
from torchvision.ops import stochastic_depth


class BatchDropPath(nn.Module):
    """The residual branch x kept for the whole batch with probability 1 - drop_prob and scaled by
    1 / (1 - drop_prob), else zeroed for the whole batch (NVIDIA common.py:291-298); identity in eval."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = float(drop_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torchvision's mode="batch": one Bernoulli on the device for the whole batch, scaled by 1 / (1 - p)
        return stochastic_depth(x, self.drop_prob, "batch", self.training)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob:.3f}, mask=batch"


def use_drop_path_mask(net: nn.Module, mask: str) -> int:
    """Apply model.drop_path_mask to a built timm network; return how many DropPath modules were replaced."""
    if mask == "sample":
        return 0
    replaced = 0
    for parent in list(net.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, DropPath):
                setattr(parent, name, BatchDropPath(child.drop_prob))
                replaced += 1
    return replaced
