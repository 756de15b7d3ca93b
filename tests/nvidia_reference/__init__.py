"""NVIDIA's PyTorch ConvNets networks, rebuilt for tests: same modules, same names, same forward.

Written for imgcls from NVIDIA's DeepLearningExamples, PyTorch/Classification/ConvNets/image_classification/
models/{resnet,efficientnet,common}.py at commit 729963dd47e7c8bd462ad10bfac7a7b0b604e6dd (2024-04-04,
BSD-3-Clause). It is not a copy of that code: it rebuilds what a published weights file depends on, i.e.
every parameter and buffer name and shape and the eval-mode forward (ResNet v1.5 bottlenecks with NVIDIA's
SE of constant width 16 applied as residual + out * se(out); EfficientNet MBConv blocks with SiLU, BN eps
1e-3, symmetric (k-1)/2 padding, SE of 0.25 x the block input or, widese, the expanded channels; SE as
Linear or, NVIDIA's `--trt`, as 1x1 convolutions). Stochastic depth and dropout are left out (eval only).

How it was checked against NVIDIA's own code: tests/test_nvidia_weights.py::
test_reference_matches_nvidias_own_code builds NVIDIA's modules from a DeepLearningExamples checkout
(NVIDIA_DLE_DIR=...), compares every state_dict key and shape with these networks and the logits with the
same weights. It ran at the commit above (see that test's docstring for the numbers); without the checkout
it skips, so CI needs nothing outside this repository.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

# name -> (block layers, widths, expansion, cardinality): IC/models/resnet.py __models
RESNETS = {
    "resnet50": ([3, 4, 6, 3], [64, 128, 256, 512], 4, 1, False),
    "resnext101-32x4d": ([3, 4, 23, 3], [128, 256, 512, 1024], 2, 32, False),
    "se-resnext101-32x4d": ([3, 4, 23, 3], [128, 256, 512, 1024], 2, 32, True),
}
SE_SQUEEZE = 16  # NVIDIA SEBottleneck: a constant hidden width

# B0 stages (kernel, stride, repeats, expansion, channels) and the (width, depth) scaling of B4.
B0_STAGES = [(3, 1, 1, 1, 16), (3, 2, 2, 6, 24), (5, 2, 2, 6, 40), (3, 2, 3, 6, 80), (5, 1, 3, 6, 112),
             (5, 2, 4, 6, 192), (3, 1, 1, 6, 320)]  # fmt: skip
EFFICIENTNETS = {  # name -> (width coefficient, depth coefficient, wide SE)
    "efficientnet-b0": (1.0, 1.0, False),
    "efficientnet-b4": (1.4, 1.8, False),
    "efficientnet-widese-b0": (1.0, 1.0, True),
    "efficientnet-widese-b4": (1.4, 1.8, True),
}


def _conv(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, bias: bool = False) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, stride=stride, padding=(k - 1) // 2, groups=groups, bias=bias)


class SqueezeExcitation(nn.Module):
    """Gate = sigmoid(expand(act(squeeze(mean over H, W)))); Linear layers, or 1x1 convs when trt."""

    def __init__(self, channels: int, squeeze: int, act: nn.Module, trt: bool) -> None:
        super().__init__()
        self.trt = trt
        self.squeeze = _conv(channels, squeeze, 1, bias=True) if trt else nn.Linear(channels, squeeze)
        self.expand = _conv(squeeze, channels, 1, bias=True) if trt else nn.Linear(squeeze, channels)
        self.activation = act

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.mean((2, 3), keepdim=self.trt)
        out = torch.sigmoid(self.expand(self.activation(self.squeeze(pooled))))
        return out if self.trt else out[:, :, None, None]


class Bottleneck(nn.Module):
    def __init__(self, cin: int, planes: int, expansion: int, stride: int, groups: int, se: bool, trt: bool) -> None:
        super().__init__()
        cout = planes * expansion
        self.conv1, self.bn1 = _conv(cin, planes, 1), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = _conv(planes, planes, 3, stride, groups), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = _conv(planes, cout, 1), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(_conv(cin, cout, 1, stride), nn.BatchNorm2d(cout))
        self.squeeze = SqueezeExcitation(cout, SE_SQUEEZE, nn.ReLU(), trt) if se else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        residual = x if self.downsample is None else self.downsample(x)
        if self.squeeze is not None:
            out = out * self.squeeze.gate(out)
        return self.relu(out + residual)


class ResNet(nn.Module):
    """Keys: conv1, bn1, layers.I.J.{conv1..bn3, downsample.0/1, squeeze.squeeze/expand}, fc."""

    def __init__(self, name: str, num_classes: int = 1000, trt: bool = False) -> None:
        super().__init__()
        depths, widths, expansion, groups, se = RESNETS[name]
        self.conv1, self.bn1 = _conv(3, 64, 7, 2), nn.BatchNorm2d(64)
        self.relu, self.maxpool = nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        stages, cin = [], 64
        for i, (depth, planes) in enumerate(zip(depths, widths)):
            blocks = []
            for j in range(depth):
                blocks.append(Bottleneck(cin, planes, expansion, 2 if i > 0 and j == 0 else 1, groups, se, trt))
                cin = planes * expansion
            stages.append(nn.Sequential(*blocks))
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.fc(self.layers(x).mean((2, 3)))


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    parts = [("conv", _conv(cin, cout, k, stride, groups)), ("bn", nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01))]
    return nn.Sequential(OrderedDict(parts + ([("act", nn.SiLU())] if act else [])))


class MBConv(nn.Module):
    def __init__(self, k: int, cin: int, cout: int, expansion: int, stride: int, wide_se: bool, trt: bool) -> None:
        super().__init__()
        hidden = cin * expansion
        self.residual = stride == 1 and cin == cout
        self.expand = None if hidden == cin else _conv_bn(cin, hidden, 1)
        self.depsep = _conv_bn(hidden, hidden, k, stride, groups=hidden)
        squeeze = max(1, int((hidden if wide_se else cin) * 0.25))
        self.se = SqueezeExcitation(hidden, squeeze, nn.SiLU(), trt)
        self.proj = _conv_bn(hidden, cout, 1, act=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.depsep(x if self.expand is None else self.expand(x))
        out = self.proj(out * self.se.gate(out))
        return x + out if self.residual else out


def _width(channels: int, coefficient: float, divisor: int = 8) -> int:
    """EffNetArch._scale_width: to a multiple of 8, never more than 10% below."""
    scaled = channels * coefficient
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * scaled else rounded


class EfficientNet(nn.Module):
    """Keys: stem.{conv,bn}, layers.I.blockJ.{expand,depsep,proj}.{conv,bn}, layers.I.blockJ.se.{squeeze,expand},
    features.{conv,bn}, classifier.fc."""

    def __init__(self, name: str, num_classes: int = 1000, trt: bool = False) -> None:
        super().__init__()
        wc, dc, wide_se = EFFICIENTNETS[name]
        cin = _width(32, wc)
        self.stem = _conv_bn(3, cin, 3, 2)
        stages = []
        for k, stride, repeats, expansion, channels in B0_STAGES:
            cout, blocks = _width(channels, wc), OrderedDict()
            for j in range(int(math.ceil(repeats * dc))):
                blocks[f"block{j}"] = MBConv(k, cin, cout, expansion, stride if j == 0 else 1, wide_se, trt)
                cin = cout
            stages.append(nn.Sequential(blocks))
        self.layers = nn.Sequential(*stages)
        self.features = _conv_bn(cin, _width(1280, wc), 1)
        self.classifier = nn.Sequential(OrderedDict(fc=nn.Linear(_width(1280, wc), num_classes)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(self.layers(self.stem(x))).mean((2, 3)))


def build(name: str, num_classes: int = 1000, trt: bool = False, seed: int = 0) -> nn.Module:
    """NVIDIA's network `name` (its --arch) with random weights and random BN statistics, in eval mode."""
    torch.manual_seed(seed)
    net = (ResNet if name in RESNETS else EfficientNet)(name, num_classes, trt)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.BatchNorm2d):  # statistics that are not 0/1, so that BN is really tested
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return net.eval()


def old_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The layout of NVIDIA's 20.06 / 20.12 NGC files: stages `layer1` ... `layerN` instead of `layers.0` ...
    (the inverse of NVIDIA's ngc_checkpoint_remap)."""
    out = {}
    for key, value in state.items():
        if key.startswith("layers."):
            _, stage, rest = key.split(".", 2)
            key = f"layer{int(stage) + 1}.{rest}"
        out[key] = value
    return out
