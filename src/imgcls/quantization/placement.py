"""Where QAT puts fake quantizers beyond modelopt's (the inputs and weights of convs, linears and pooling).

`recipe.qat.quantizers=nvidia` adds those of NVIDIA's efficientnet-quant networks, which quantize every tensor
that TensorRT's INT8 kernels read, not only conv inputs:

- the squeeze-excitation multiply: both operands, the gate (`mul_a_quantizer`) and the features
  (`mul_b_quantizer`), PyTorch/Classification/ConvNets/image_classification/models/common.py:236-242,251-253;
  and the SE's pooling input, which NVIDIA's quantized blocks get by building the TRT SE with an
  `nn.AdaptiveAvgPool2d` that pytorch-quantization replaces (models/efficientnet.py:416-420, common.py:167-185);
- the residual input of every block with an identity shortcut (`residual_quantizer`, efficientnet.py:432-436,
  449-452), so the addition reads two INT8 tensors.

Every one is an activation quantizer like modelopt's conv inputs: int8, symmetric, per tensor, with the run's
calibrator (NVIDIA builds them from QuantConv2d's default input descriptor). timm's blocks get them by becoming
a subclass whose forward is timm's with the quantizers in (the class changes in place, so parameters, buffers
and hooks stay); `add_quantizers` is run before calibration and again on a fresh network before a checkpoint's
quantizer state is restored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from timm.models._efficientnet_blocks import DepthwiseSeparableConv, InvertedResidual, SqueezeExcite
from torch import nn

from imgcls.errors import ConfigError


def _quantizer(calibrator: str) -> nn.Module:
    """An activation quantizer as NVIDIA's QuantConv2d.default_quant_desc_input: 8 bits, per tensor."""
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer

    return TensorQuantizer(QuantizerAttributeConfig(num_bits=8, axis=None, calibrator=calibrator))


class QuantSqueezeExcite(SqueezeExcite):
    """timm's SqueezeExcite.forward with NVIDIA's quantized SE: pooling input, gate and features quantized."""

    if TYPE_CHECKING:  # the submodules add_quantizers adds (for the checker only: torch.jit.script reads annotations)
        pool_quantizer: nn.Module
        mul_a_quantizer: nn.Module
        mul_b_quantizer: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_se = self.pool_quantizer(x).mean((2, 3), keepdim=True)
        x_se = self.conv_reduce(x_se)
        x_se = self.act1(x_se)
        x_se = self.conv_expand(x_se)
        return self.mul_b_quantizer(x) * self.mul_a_quantizer(self.gate(x_se))


class QuantInvertedResidual(InvertedResidual):
    """timm's InvertedResidual.forward with the identity shortcut quantized before the addition."""

    if TYPE_CHECKING:  # for the checker only: torch.jit.script reads class annotations
        residual_quantizer: nn.Module  # added by add_quantizers after the class change
        aa: nn.Module  # timm's create_aa: nn.Identity when off (its noop default), so never None in these blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        if self.conv_s2d is not None:
            x = self.conv_s2d(x)
            x = self.bn_s2d(x)
        x = self.conv_pw(x)
        x = self.bn1(x)
        x = self.conv_dw(x)
        x = self.bn2(x)
        x = self.aa(x)
        x = self.se(x)
        x = self.conv_pwl(x)
        x = self.bn3(x)
        if self.has_skip:
            x = self.drop_path(x) + self.residual_quantizer(shortcut)
        return x


class QuantDepthwiseSeparableConv(DepthwiseSeparableConv):
    """timm's DepthwiseSeparableConv.forward with the identity shortcut quantized before the addition."""

    if TYPE_CHECKING:  # for the checker only: torch.jit.script reads class annotations
        residual_quantizer: nn.Module  # added by add_quantizers after the class change
        aa: nn.Module  # timm's create_aa: nn.Identity when off (its noop default), so never None in these blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        if self.conv_s2d is not None:
            x = self.conv_s2d(x)
            x = self.bn_s2d(x)
        x = self.conv_dw(x)
        x = self.bn1(x)
        x = self.aa(x)
        x = self.se(x)
        x = self.conv_pw(x)
        x = self.bn2(x)
        if self.has_skip:
            x = self.drop_path(x) + self.residual_quantizer(shortcut)
        return x


_QUANTIZED: dict[type, tuple[type, tuple[str, ...]]] = {
    SqueezeExcite: (QuantSqueezeExcite, ("pool_quantizer", "mul_a_quantizer", "mul_b_quantizer")),
    InvertedResidual: (QuantInvertedResidual, ("residual_quantizer",)),
    DepthwiseSeparableConv: (QuantDepthwiseSeparableConv, ("residual_quantizer",)),
}


def add_quantizers(net: nn.Module, quantizers: str, calibrator: str = "max") -> int:
    """Add the `quantizers` set's extra quantizers to net (in place); return how many were added. The exact
    classes only: a subclass of timm's blocks (CondConv, a block already converted) keeps its own forward."""
    if quantizers == "conv_linear":
        return 0
    added = 0
    for module in list(net.modules()):
        quantized = _QUANTIZED.get(type(module))
        if quantized is None or (hasattr(module, "has_skip") and not module.has_skip):
            continue
        cls, names = quantized
        module.__class__ = cls
        for name in names:
            module.add_module(name, _quantizer(calibrator))
        added += len(names)
    if not added:
        raise ConfigError(
            f"recipe.qat.quantizers=nvidia places NVIDIA's EfficientNet quantizers (SE multiply, residual input); "
            f"{type(net).__name__} has no timm EfficientNet blocks: use recipe.qat.quantizers=conv_linear"
        )
    return added


def extra_quantizer_names(net: nn.Module) -> set[str]:
    """The module names of the quantizers add_quantizers added to net."""
    names: set[str] = set()
    for prefix, module in net.named_modules():
        for cls, quantizers in _QUANTIZED.values():
            if type(module) is cls:
                names.update(f"{prefix}.{name}" if prefix else name for name in quantizers)
    return names


def placement_of(net: nn.Module) -> str:
    """Which set a quantized network carries (what a checkpoint records for add_quantizers to redo)."""
    return "nvidia" if any(type(m) in (c for c, _ in _QUANTIZED.values()) for m in net.modules()) else "conv_linear"


def describe(quantizers: Any) -> str:
    return {
        "conv_linear": "conv/linear/pool inputs",
        "nvidia": "conv/linear/pool inputs, SE multiply and pooling, residual inputs (NVIDIA efficientnet-quant)",
    }.get(str(quantizers), str(quantizers))
