"""The squeeze-and-excitation variants of NVIDIA's networks, as timm keyword arguments.

- SE-ResNe(X)t: the paper and NVIDIA's TF1 code squeeze to C/16 channels (timm's default, `se_width=null`);
  NVIDIA's PyTorch code squeezes every block to a constant 16 (`se_width=16`, IC/models/resnet.py
  SEBottleneck `se_squeeze=16`): 45,251,128 parameters for SE-ResNeXt101-32x4d instead of 48,955,416.
  Its published PyTorch results and NGC weights are that network.
- EfficientNet: the SE squeezes to 0.25 x the block's *input* channels (timm's default); NVIDIA's
  `efficientnet-widese-*` squeeze to 0.25 x the block's expanded hidden channels (`wide_se=true`,
  IC/models/efficientnet.py MBConvBlock `squeeze_hidden=True`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from timm.layers import SEModule
from timm.models._efficientnet_blocks import SqueezeExcite

from imgcls.errors import ConfigError

# timm architectures whose blocks take an `attn_layer` SE module (ResNet class with SE bottlenecks).
SE_RESNET_PREFIXES = ("seresnet", "seresnext")
WIDE_SE_RATIO = 0.25  # NVIDIA EffNetArch.squeeze_excitation_ratio, of the expanded channels when widese


def wide_squeeze_excite(in_chs: int, rd_ratio: float = WIDE_SE_RATIO, **kwargs: Any) -> SqueezeExcite:
    """timm's EfficientNet builder hands each block's SE its expanded (mid) channels and a ratio rescaled to
    the block's input channels (rd_ratio = 0.25 / expansion); NVIDIA's wide SE ignores the expansion:
    0.25 x mid, rounded down as NVIDIA's int()."""
    del rd_ratio  # the input-relative ratio is exactly what wide SE does not use
    return SqueezeExcite(in_chs, rd_ratio=WIDE_SE_RATIO, rd_round_fn=int, **kwargs)


def se_kwargs(arch: str, se_width: int | None, wide_se: bool) -> dict[str, Any]:
    """timm.create_model keyword arguments for model.se_width / model.wide_se (empty for the defaults)."""
    kwargs: dict[str, Any] = {}
    if se_width is not None:
        if not arch.startswith(SE_RESNET_PREFIXES):
            raise ConfigError(
                f"model.se_width={se_width} applies only to SE-ResNe(X)t archs ({', '.join(SE_RESNET_PREFIXES)}*), "
                f"not model.arch={arch}; use null"
            )
        kwargs["block_args"] = {"attn_layer": partial(SEModule, rd_channels=int(se_width))}
    if wide_se:
        if not arch.startswith("efficientnet_b"):
            raise ConfigError(f"model.wide_se=true applies only to efficientnet_b* archs, not model.arch={arch}")
        kwargs["se_layer"] = wide_squeeze_excite
    return kwargs
