"""Build a classifier network with timm (no hand-written architectures) and NVIDIA's init."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Literal

import timm
import torch
from timm.layers import SEModule
from timm.layers.weight_init import trunc_normal_tf_, variance_scaling_
from timm.models._efficientnet_blocks import SqueezeExcite
from torch import nn

from imgcls.config.choices import CONV_INIT_ALIASES, TF_INITS
from imgcls.errors import ConfigError
from imgcls.models.squeeze_excitation import SE_RESNET_PREFIXES, se_kwargs
from imgcls.models.stochastic_depth import use_drop_path_mask
from imgcls.models.weights import in_network_layout, load_state, read_state_dict

if TYPE_CHECKING:
    from imgcls.config.schema import ModelSchema

log = logging.getLogger(__name__)

# timm's SE blocks: ResNet-family `attn_layer="se"` and EfficientNet's (also imgcls's wide SE).
SE_BLOCKS = (SEModule, SqueezeExcite)

# model.conv_init's He modes (after CONV_INIT_ALIASES) as kaiming_normal_'s mode argument.
FAN_MODES: dict[str, Literal["fan_in", "fan_out"]] = {"fan_in": "fan_in", "fan_out": "fan_out"}


def build_network(cfg: ModelSchema, num_classes: int) -> nn.Module:
    """timm.create_model(cfg.arch, pretrained=False) + NVIDIA init + optional weights file. `cfg` has every key of
    the model schema: a composed config, or a mapping merged onto the schema (typed_config.settings)."""
    if not timm.is_model(cfg.arch):
        raise ConfigError(f"model.arch={cfg.arch} is not a timm architecture")
    kwargs: dict[str, Any] = {"drop_rate": float(cfg.drop_rate)}
    if cfg.drop_path_rate:
        kwargs["drop_path_rate"] = float(cfg.drop_path_rate)
    state = read_state_dict(cfg.weights) if cfg.weights else None
    se_width = cfg.se_width
    if se_width is None and state is not None:
        se_width = se_width_of(str(cfg.arch), state, f"model.weights={cfg.weights}")
    kwargs.update(se_kwargs(cfg.arch, se_width, bool(cfg.wide_se)))
    net = timm.create_model(cfg.arch, pretrained=False, num_classes=num_classes, **kwargs)
    use_drop_path_mask(net, cfg.drop_path_mask)  # per sample (timm, TF2) or per batch
    init_nvidia(net, conv_init=cfg.conv_init, zero_init_last_bn=bool(cfg.zero_init_last_bn))
    set_batchnorm(net, momentum=cfg.bn_momentum, eps=cfg.bn_eps)
    if state is not None:
        load_state(net, state, f"model.weights={cfg.weights}", cfg.arch)
    return net


def se_width_of(arch: str, state: dict[str, torch.Tensor], source: str) -> int | None:
    """The constant SE width of a SE-ResNe(X)t state_dict whose SE layers do not fit the default C/16 network
    (NVIDIA's PyTorch files squeeze every block to 16), else None: NGC files load with the model name alone."""
    if not arch.startswith(SE_RESNET_PREFIXES):
        return None
    default = timm.create_model(arch, pretrained=False)
    _, state = in_network_layout(default, state)  # NVIDIA's key layouts as timm's
    own = {k: v.shape[0] for k, v in default.state_dict().items() if k.endswith(".se.fc1.weight")}
    found = {k: state[k].shape[0] for k in own if k in state and state[k].dim() == 4}
    widths = set(found.values())
    if len(found) != len(own) or len(widths) != 1 or found == own:
        return None  # not an SE file of this network, or the default widths: load_state says what does not fit
    width = widths.pop()
    log.info("model.se_width=%d: %s squeezes every SE block to %d channels (NVIDIA's PyTorch SE)", width, source, width)
    return width


def init_nvidia(net: nn.Module, conv_init: str = "fan_in", zero_init_last_bn: bool = False) -> None:
    """Kaiming-normal convs (NVIDIA IC/models/common.py LayerBuilder.conv), BN gamma 1 / beta 0.

    Linear layers and the SE blocks' layers get PyTorch's default init, as in NVIDIA's code: its classifiers and
    SE layers are `nn.Linear`s nothing initializes again (PYT/image_classification/models/common.py:146-150;
    LayerBuilder initializes convs and BN only, :52-54, :116-119). timm's SE layers are 1x1 convs, whose default
    init is Linear's; timm's own init (EfficientNet's classifier, its SE convs) is replaced. timm zero-inits the
    last BN of each residual block by default; NVIDIA does not (--last_bn_0_init False), so it is opt-in here.
    """
    conv_init = CONV_INIT_ALIASES.get(conv_init, conv_init)
    squeeze_excitation = {id(m) for block in net.modules() if isinstance(block, SE_BLOCKS) for m in block.modules()}
    for module in net.modules():
        if conv_init in TF_INITS and isinstance(module, (nn.Conv2d, nn.Linear)):
            init_tensorflow(module, conv_init, in_squeeze_excitation=id(module) in squeeze_excitation)
        elif isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and id(module) in squeeze_excitation):
            module.reset_parameters()
        elif isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode=FAN_MODES[conv_init], nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    if zero_init_last_bn:
        for module in net.modules():
            zero_init_last = getattr(module, "zero_init_last", None)  # timm's residual blocks have it
            if zero_init_last is not None and module is not net:
                zero_init_last()


def init_tensorflow(module: nn.Conv2d | nn.Linear, scheme: str, in_squeeze_excitation: bool = False) -> None:
    """TF's VarianceScaling initializers on one conv or dense layer (biases zero), through timm's helpers.

    tf1: TF1 ConvNets `variance_scaling_initializer(scale=2.0, distribution='truncated_normal', mode=fan_in)`
    for conv and dense kernels (TF1/model/resnet.py:89-101), except the SE block's two dense layers: the
    bottleneck calls squeeze_excitation_layer without an initializer
    (TF1/model/blocks/resnet_bottleneck_block.py:135-140), whose default is `variance_scaling_initializer()`,
    scale 1.0, fan_in, truncated normal (TF1/model/layers/squeeze_excitation_layer.py:32), and ResNeXt's grouped
    3x3 convs: their filter is a `tf.get_variable` without an initializer
    (TF1/model/blocks/conv2d_block.py:61-65), so TF's default, Glorot uniform, with TF's fans of a [3, 3,
    C/groups, C] filter, which are torch's xavier_uniform_'s. tf2: TF2 EfficientNet v1 convs
    VarianceScaling(2.0, 'normal', fan_out), dense VarianceScaling(1/3, 'uniform', fan_out)
    (TF2/model/blocks/conv2d_block.py, efficientnet_model_v1.py). TF2's Keras maps 'normal' to
    'truncated_normal': a normal cut at 2 stddev whose stddev is divided by 0.8796 (the stddev of a unit normal
    truncated to [-2, 2]) so the variance stays scale / fan. That truncated, corrected normal is what both
    schemes use here (timm's variance_scaling_), TF1's grouped convs apart.
    """
    weight = module.weight
    if scheme == "tf1" and isinstance(module, nn.Conv2d) and module.groups > 1:
        nn.init.xavier_uniform_(weight)
    elif scheme == "tf1":
        scale = 1.0 if in_squeeze_excitation else 2.0
        variance_scaling_(weight, scale=scale, mode="fan_in", distribution="truncated_normal")
    elif isinstance(module, nn.Conv2d):
        # Keras counts a depthwise kernel's fan_out as kh x kw x depth multiplier; torch's fan_out would be
        # kh x kw x channels. out x kh x kw / groups is Keras' count for plain, grouped and depthwise convs.
        fan_out = module.out_channels * weight[0, 0].numel() // module.groups
        trunc_normal_tf_(weight, std=math.sqrt(2.0 / fan_out) / 0.87962566103423978)
    else:
        variance_scaling_(weight, scale=1.0 / 3.0, mode="fan_out", distribution="uniform")
    if module.bias is not None:
        nn.init.zeros_(module.bias)


def set_batchnorm(net: nn.Module, momentum: float | None, eps: float | None) -> None:
    for module in net.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            if momentum is not None:
                module.momentum = float(momentum)
            if eps is not None:
                module.eps = float(eps)


def count_parameters(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())
