"""Networks: published parameter counts, ResNet v1.5 topology, NVIDIA init, weights files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from omegaconf.errors import MissingMandatoryValue

from imgcls.errors import CheckpointError
from imgcls.models import build_network
from imgcls.models.factory import count_parameters
from tests.conftest import compose_config

# Published parameter counts at 1,000 classes: the papers / torchvision model tables; SE-ResNeXt101-32x4d
# from Hu et al.'s reference implementation (SE reduction C/16). NVIDIA publishes no count for its widese
# EfficientNets: those two are the counts of NVIDIA's own network code (IC/models/efficientnet.py at
# DeepLearningExamples 729963dd, built with efficientnet-widese-b0/b4 and counted; tests/nvidia_reference
# rebuilds it and test_nvidia_weights compares every tensor shape).
PUBLISHED_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "resnext50_32x4d": 25_028_904,
    "resnext101_32x4d": 44_177_704,
    "resnext101_32x8d": 88_791_336,
    "se_resnext101_32x4d": 48_955_416,
    "efficientnet_widese_b0": 8_423_848,
    "efficientnet_widese_b4": 34_927_246,
    "efficientnet_b0": 5_288_548,
    "efficientnet_b1": 7_794_184,
    "efficientnet_b2": 9_109_994,
    "efficientnet_b3": 12_233_232,
    "efficientnet_b4": 19_341_616,
    "efficientnet_b5": 30_389_784,
    "efficientnet_b6": 43_040_704,
    "efficientnet_b7": 66_347_960,
}


@pytest.mark.slow
@pytest.mark.parametrize("model,params", PUBLISHED_PARAMS.items())
def test_parameter_count_matches_published(model: str, params: int) -> None:
    net = build_network(compose_config([f"model={model}"]).model, num_classes=1000)
    assert count_parameters(net) == params


@pytest.mark.slow
def test_se_resnext_se_width_16_is_nvidia_pytorch_network() -> None:
    """NVIDIA's PyTorch SE-ResNeXt101-32x4d squeezes every block to 16 channels (45,251,128 parameters, as
    NVIDIA's network has), applied to the output of bn3 before the residual add, as NVIDIA's Bottleneck does."""
    net = build_network(compose_config(["model=se_resnext101_32x4d", "model.se_width=16"]).model, 1000)
    assert count_parameters(net) == 45_251_128
    block = net.layer3[22]
    assert block.se.fc1.out_channels == 16 and block.se.fc2.in_channels == 16
    assert block.se.fc1.in_channels == block.bn3.num_features == 1024
    default = build_network(compose_config(["model=se_resnext101_32x4d"]).model, 1000)
    assert default.layer3[22].se.fc1.out_channels == 1024 // 16  # C/16, the paper's and TF1's


@pytest.mark.slow
def test_pytorch_se_resnext_experiments_train_nvidias_network() -> None:
    """The experiments carrying NVIDIA's PyTorch SE-ResNeXt top-1 build the network that top-1 was measured
    with (SE width 16); the model's own default stays the paper's C/16."""
    from imgcls.config.compose import options

    names = [n for n in options("experiment") if n.startswith("se_resnext101_32x4d_")]
    assert len(names) == 8
    for name in names:
        assert compose_config([f"experiment={name}"]).model.se_width == 16, name
    assert compose_config(["model=se_resnext101_32x4d"]).model.se_width is None


def test_widese_squeezes_the_expanded_channels() -> None:
    plain = build_network(compose_config(["model=efficientnet_b0"]).model, 1000)
    wide = build_network(compose_config(["model=efficientnet_widese_b0"]).model, 1000)
    # Stage 2, block 0: 24 input channels expanded x6 to 144; SE 0.25 x 24 = 6 vs 0.25 x 144 = 36.
    assert plain.blocks[2][0].se.conv_reduce.out_channels == 6
    assert wide.blocks[2][0].se.conv_reduce.out_channels == 36
    assert isinstance(wide.blocks[2][0].se.act1, torch.nn.SiLU)


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["model=resnet50", "+model.se_width=16"], "model.se_width=16 applies only to SE-ResNe(X)t archs"),
        (["model=resnet50", "+model.wide_se=true"], "model.wide_se=true applies only to efficientnet_b"),
    ],
)
def test_se_options_on_a_network_without_them_are_refused(overrides: list[str], needle: str) -> None:
    from imgcls.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(needle)):
        build_network(compose_config(overrides).model, 10)


def test_resnext101_32x8d_basic_is_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """NVIDIA's stale README usage block lists `resnext101-32x8d-basic`, a network no NVIDIA code defined;
    NVIDIA's other --arch spellings get imgcls's name."""
    from imgcls.cli import check_group_choices
    from imgcls.config.compose import options

    assert "resnext101_32x8d" in options("model") and "resnext50_32x4d" in options("model")
    assert not [name for name in options("model") if "basic" in name]
    for arg, needle in (
        ("model=resnext101-32x8d-basic", "model=resnext101-32x8d-basic is only in the --arch list of NVIDIA's stale"),
        ("model=se-resnext101-32x4d", "is NVIDIA's --arch spelling; imgcls's is model=se_resnext101_32x4d"),
    ):
        with pytest.raises(SystemExit) as exit_:
            check_group_choices([arg])
        assert exit_.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], lines


def model_cfg(*overrides: str):
    return compose_config(["model=resnet50", *overrides]).model


def test_resnet50_is_v1_5() -> None:
    net = build_network(model_cfg(), num_classes=10)
    block = net.layer2[0]
    assert block.conv1.stride == (1, 1) and block.conv2.stride == (2, 2)  # stride in the 3x3 conv
    assert block.conv2.kernel_size == (3, 3)


# NVIDIA's legacy --model-config names are aliases: classic/grp-fanout = fan_out, fanin/grp-fanin = fan_in.
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fan_in", "fan_out", "classic", "fanin", "grp-fanin", "grp-fanout"])
def test_kaiming_conv_init(mode: str) -> None:
    torch.manual_seed(0)
    net = build_network(model_cfg(f"model.conv_init={mode}"), num_classes=10)
    conv = net.layer3[0].conv1  # 1x1, 512 -> 256
    fan = conv.in_channels if mode in ("fan_in", "fanin", "grp-fanin") else conv.out_channels
    expected = (2.0 / fan) ** 0.5
    assert conv.weight.std().item() == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize("model", ["efficientnet_b0", "se_resnext101_32x4d"])
def test_se_layers_and_classifier_take_pytorchs_default_init_as_nvidias_linears(model: str) -> None:
    """NVIDIA's SE layers and classifiers are nn.Linear with PyTorch's default init (PYT/image_classification/
    models/common.py:146-150): weights and biases uniform within 1/sqrt(fan_in). timm's SE 1x1 convs got Kaiming
    normal with zero biases, EfficientNet's classifier timm's own uniform(1/sqrt(fan_out))."""
    torch.manual_seed(0)
    net = build_network(compose_config([f"model={model}"]).model, num_classes=1000)
    se = [m for m in net.modules() if type(m).__name__ in ("SEModule", "SqueezeExcite")]
    layers = [c for block in se[:3] for c in block.modules() if isinstance(c, torch.nn.Conv2d)]
    assert len(layers) == 6
    for layer in [*layers, net.get_classifier()]:
        bound = 1 / layer.weight[0].numel() ** 0.5
        for tensor in (layer.weight, layer.bias):
            assert tensor.abs().max().item() <= bound, layer
            assert tensor.numel() < 64 or tensor.abs().max().item() > 0.8 * bound, layer  # uniform, not zero
        assert layer.weight.std().item() == pytest.approx(bound / 3**0.5, rel=0.1), layer


def test_last_bn_zero_init_is_opt_in() -> None:
    default = build_network(model_cfg(), num_classes=10)
    assert torch.all(default.layer1[0].bn3.weight == 1)  # NVIDIA's default (timm would zero it)
    zeroed = build_network(model_cfg("model.zero_init_last_bn=true"), num_classes=10)
    assert torch.all(zeroed.layer1[0].bn3.weight == 0)
    assert torch.all(zeroed.layer1[0].bn1.weight == 1)


def test_efficientnet_batchnorm_and_dropout_as_published() -> None:
    net = build_network(compose_config(["model=efficientnet_b4"]).model, num_classes=10)
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(bn.momentum == 0.01 and bn.eps == 1e-3 for bn in bns)
    assert net.drop_rate == 0.4
    drop_paths = [m.drop_prob for m in net.modules() if type(m).__name__ in ("DropPath", "BatchDropPath")]
    assert drop_paths and max(drop_paths) == pytest.approx(0.2, abs=0.01)


@pytest.mark.slow
def test_weights_file_initializes_and_replaces_a_head_of_another_size(tmp_path: Path) -> None:
    source = build_network(model_cfg(), num_classes=1000)
    path = tmp_path / "rn50.pt"
    torch.save({f"module.{k}": v for k, v in source.state_dict().items()}, path)  # DDP-style prefix
    net = build_network(model_cfg(f"model.weights={path}"), num_classes=7)
    assert torch.equal(net.layer4[2].conv3.weight, source.layer4[2].conv3.weight)
    assert net.fc.weight.shape == (7, 2048)


def test_weights_of_another_architecture_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "b0.pt"
    torch.save(build_network(compose_config(["model=efficientnet_b0"]).model, 10).state_dict(), path)
    with pytest.raises(CheckpointError, match="does not fit model resnet50: .* missing"):
        build_network(model_cfg(f"model.weights={path}"), num_classes=10)


def module_configs(*overrides: str) -> tuple[dict, dict]:
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(compose_config(["model=resnet18", "precision=fp32", *overrides]), resolve=True)
    return cfg["model"], cfg["recipe"]


def test_config_keys_of_the_module_are_not_read_as_none() -> None:
    """A mistyped key read None before, e.g. `recipe.ema_deacy`: EMA silently off."""
    from imgcls.training.module import ClassificationModule

    model, recipe = module_configs("recipe.ema_decay=0.99")
    module = ClassificationModule(model, recipe, plan={}, classes=["a", "b"])
    assert module.ema is not None and module.recipe.ema_decay == 0.99
    with pytest.raises(AttributeError, match="ema_deacy"):
        _ = module.recipe.ema_deacy
    with pytest.raises(AttributeError, match="chanels_last"):
        _ = module.model_cfg.chanels_last


def test_checkpoint_hyperparameters_without_newer_keys_load_with_their_defaults() -> None:
    """A checkpoint written before an optional key existed: the key's "off" value (module.MODEL_DEFAULTS /
    RECIPE_DEFAULTS), not an error; a required key missing is still an error."""
    from imgcls.training.module import MODEL_DEFAULTS, RECIPE_DEFAULTS, ClassificationModule

    model, recipe = module_configs()
    old_model = {k: v for k, v in model.items() if k not in MODEL_DEFAULTS}
    old_recipe = {k: v for k, v in recipe.items() if k not in RECIPE_DEFAULTS}
    module = ClassificationModule(old_model, old_recipe, plan={}, classes=["a", "b"])
    assert module.ema is None and module.mixup is None and module.channels_last is False
    assert set(MODEL_DEFAULTS) <= set(model) and set(RECIPE_DEFAULTS) <= set(recipe)  # real keys, no typos
    del old_model["drop_rate"]
    with pytest.raises(MissingMandatoryValue, match="drop_rate"):  # the schema has no default for it
        ClassificationModule(old_model, old_recipe, plan={}, classes=["a", "b"])


class _Payload:
    """Unpickling this runs Path(marker).touch(): what a hostile 'weights file' could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (Path.touch, (self.marker,))


@pytest.mark.slow
def test_weights_files_are_never_unpickled_with_code(tmp_path: Path) -> None:
    from imgcls.models.weights import read_torch_file
    from imgcls.training.checkpoint import check_resumable

    marker = tmp_path / "code-ran"
    hostile = tmp_path / "hostile.pt"
    torch.save({"state_dict": {"fc.weight": torch.zeros(2, 2)}, "x": _Payload(marker)}, hostile)
    for load in (
        lambda: build_network(model_cfg(f"model.weights={hostile}"), num_classes=10),  # train/fine-tune
        lambda: check_resumable(str(hostile), "resnet50", ["a"]),  # ckpt_path=
        lambda: read_torch_file(hostile, "ckpt"),  # evaluate / export / classify
    ):
        with pytest.raises(CheckpointError, match="hostile.pt .*not unpickled"):
            load()
    assert not marker.exists()


def _drop_path_outputs(module: torch.nn.Module, draws: int = 200) -> list[torch.Tensor]:
    """`draws` training-mode outputs of a drop-path module on a batch of 16 ones (seeded)."""
    torch.manual_seed(0)
    module.train()
    return [module(torch.ones(16, 3, 2, 2)) for _ in range(draws)]


def test_nvidia_pytorch_efficientnet_drops_the_residual_of_the_whole_batch_or_none() -> None:
    """NVIDIA's StochasticDepthResidual (IC/models/common.py:281-298) draws one scalar mask per forward pass: every
    sample's branch is kept x 1/survival_prob, or none is. timm's DropPath drew one mask per sample."""
    from imgcls.models.stochastic_depth import BatchDropPath

    net = build_network(compose_config(["model=efficientnet_b4"]).model, num_classes=10)
    batchwise = [m for m in net.modules() if isinstance(m, BatchDropPath)]
    assert batchwise and not [m for m in net.modules() if type(m).__name__ == "DropPath"]
    assert max(m.drop_prob for m in batchwise) == pytest.approx(0.2, abs=0.01)  # timm's per-block rates kept
    block = max(batchwise, key=lambda m: m.drop_prob)
    outputs = _drop_path_outputs(block)
    keep = 1 / (1 - block.drop_prob)
    kinds = {"none" if torch.all(y == 0) else "all" if torch.allclose(y, torch.full_like(y, keep)) else "mixed"
             for y in outputs}  # fmt: skip
    assert kinds == {"none", "all"}  # both happen in 200 draws; never a batch with some samples dropped
    block.eval()
    assert torch.equal(block(torch.ones(4, 3)), torch.ones(4, 3))


def test_tf2_efficientnet_keeps_timms_per_sample_drop_path() -> None:
    """TF2's drop_connect is a Dropout with noise_shape (None, 1, 1, 1): one Bernoulli per sample
    (TF2/model/blocks/mb_conv_block.py:132-134), timm's DropPath."""
    cfg = compose_config(["experiment=tf2_efficientnet_b4_8xa100_amp"]).model
    assert cfg.drop_path_mask == "sample"
    net = build_network(cfg, num_classes=10)
    drop_paths = [m for m in net.modules() if type(m).__name__ == "DropPath"]
    assert drop_paths and not [m for m in net.modules() if type(m).__name__ == "BatchDropPath"]
    outputs = _drop_path_outputs(max(drop_paths, key=lambda m: m.drop_prob), draws=20)
    per_sample = torch.stack([y.flatten(1).amax(1) > 0 for y in outputs])  # (draws, 16) kept or not
    assert bool((per_sample.any(1) & ~per_sample.all(1)).any())  # some batches keep some samples only


def test_drop_path_mask_is_checked_in_one_line() -> None:
    from imgcls.config.checks import check_config
    from imgcls.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.drop_path_mask"):
        check_config(compose_config(["model=efficientnet_b4", "model.drop_path_mask=channel"]))
