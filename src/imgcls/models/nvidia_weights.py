"""NVIDIA's published PyTorch weights (NGC, DeepLearningExamples ConvNets) in timm's key layout.

NVIDIA published two key layouts of the same networks (IC/models/{resnet,efficientnet}.py):
- the NGC files of 20.06 (ResNets) and 20.12 (EfficientNets): stages as attributes `layer1` ... `layerN`
  (`layer1.0.conv1`, `layer1.block0.depsep.conv`), usually behind DDP's `module.` prefix;
- the code since commit 4f2c6922 (Nov 2021, TorchScriptable ConvNets): stages in one Sequential
  (`layers.0.0.conv1`, `layers.0.block0.depsep.conv`); NVIDIA's `ngc_checkpoint_remap` renames the first
  layout to this one when it downloads an NGC file.
Both name the rest alike: ResNet `conv1`/`bn1` stem, SE `squeeze.squeeze`/`squeeze.expand`, head `fc`;
EfficientNet `stem.{conv,bn}`, blocks `expand`/`depsep`/`se`/`proj`, head `features.{conv,bn}` and
`classifier.fc`. SE weights are Linear (2-D) or, with NVIDIA's `--trt`, 1x1 convolutions (4-D); timm's SE
are 1x1 convolutions, so 2-D ones get two unit dimensions.

The prefix `module.` and a `state_dict` wrapper are removed before (models/weights.py state_dict_of).
How these maps were checked: tests/test_nvidia_weights.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

# Parts of a ResNet bottleneck key after its `layerN.J.` / `layers.I.J.` prefix.
_RESNET_SE = {"squeeze.squeeze.": "se.fc1.", "squeeze.expand.": "se.fc2."}

# EfficientNet: module renames of a block with an expansion conv (timm InvertedResidual) and of one
# without (expansion 1, timm DepthwiseSeparableConv).
_MBCONV = {
    "expand.conv.": "conv_pw.",
    "expand.bn.": "bn1.",
    "depsep.conv.": "conv_dw.",
    "depsep.bn.": "bn2.",
    "se.squeeze.": "se.conv_reduce.",
    "se.expand.": "se.conv_expand.",
    "proj.conv.": "conv_pwl.",
    "proj.bn.": "bn3.",
}
_DEPTHWISE_SEPARABLE = {
    "depsep.conv.": "conv_dw.",
    "depsep.bn.": "bn1.",
    "se.squeeze.": "se.conv_reduce.",
    "se.expand.": "se.conv_expand.",
    "proj.conv.": "conv_pw.",
    "proj.bn.": "bn2.",
}
_EFFICIENTNET_TOP = {
    "stem.conv.": "conv_stem.",
    "stem.bn.": "bn1.",
    "features.conv.": "conv_head.",
    "features.bn.": "bn2.",
    "classifier.fc.": "classifier.",
}

_OLD_STAGE = re.compile(r"^layer(\d+)\.")  # 20.06 / 20.12 NGC files: layer1 ... layerN
_NEW_STAGE = re.compile(r"^layers\.(\d+)\.")  # current code: layers.0 ... layers.N-1


def _stage_index(key: str, old: bool) -> tuple[int, str] | None:
    """(0-based stage, rest of the key) of a stage key of this layout, else None."""
    match = (_OLD_STAGE if old else _NEW_STAGE).match(key)
    if match is None:
        return None
    return int(match.group(1)) - (1 if old else 0), key[match.end() :]


def _rename(rest: str, table: dict[str, str]) -> str | None:
    for old, new in table.items():
        if rest.startswith(old):
            return new + rest[len(old) :]
    return None


def _resnet(state: dict[str, torch.Tensor], old: bool) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state.items():
        staged = _stage_index(key, old)
        if staged is None:
            out[key] = value  # conv1, bn1, fc: timm's names already
            continue
        stage, rest = staged
        block, _, inner = rest.partition(".")
        se = _rename(inner, _RESNET_SE)
        out[f"layer{stage + 1}.{block}.{se or inner}"] = _as_conv(value) if se else value
    return out


def _efficientnet(state: dict[str, torch.Tensor], old: bool) -> dict[str, torch.Tensor]:
    split = {key: _block_key(key, old) for key in state}
    # Blocks with an expansion conv are timm InvertedResiduals; the others DepthwiseSeparableConvs.
    expanding = {(s[0], s[1]) for s in split.values() if s and s[2].startswith("expand.conv.")}
    out = {}
    for key, value in state.items():
        parts = split[key]
        if parts is None:
            out[_rename(key, _EFFICIENTNET_TOP) or key] = value
            continue
        stage, block, inner = parts
        table = _MBCONV if (stage, block) in expanding else _DEPTHWISE_SEPARABLE
        renamed = _rename(inner, table)
        is_se = inner.startswith("se.")
        out[f"blocks.{stage}.{block}.{renamed or inner}"] = _as_conv(value) if is_se else value
    return out


def _block_key(key: str, old: bool) -> tuple[int, int, str] | None:
    """(stage, block, rest) of an EfficientNet block key `layers.I.blockJ.rest` (`layerN.blockJ.rest`)."""
    staged = _stage_index(key, old)
    if staged is None:
        return None
    match = re.match(r"^block(\d+)\.", staged[1])
    return (staged[0], int(match.group(1)), staged[1][match.end() :]) if match else None


def _as_conv(value: torch.Tensor) -> torch.Tensor:
    """NVIDIA's Linear SE weight (out, in) as timm's 1x1 conv weight (out, in, 1, 1); biases and 4-D stay."""
    return value[:, :, None, None] if value.dim() == 2 else value


@dataclass(frozen=True)
class Layout:
    """A key layout NVIDIA published, and how to turn a state_dict in it into timm's keys."""

    name: str
    to_timm: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


LAYOUTS = (
    Layout("NVIDIA ResNet, NGC 20.06 (layer1.0.conv1, squeeze.squeeze)", partial(_resnet, old=True)),
    Layout("NVIDIA ResNet, current (layers.0.0.conv1, squeeze.squeeze)", partial(_resnet, old=False)),
    Layout("NVIDIA EfficientNet, NGC 20.12 (layer1.block0, stem.conv, classifier)", partial(_efficientnet, old=True)),
    Layout("NVIDIA EfficientNet, current (layers.0.block0, stem.conv, classifier)", partial(_efficientnet, old=False)),
)
