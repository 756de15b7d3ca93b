"""What the TF experiments train with beyond their numbers: TF's RMSprop update and TF's weight initializers."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from imgcls.config.checks import check_config
from imgcls.errors import ConfigError
from imgcls.models.factory import build_network
from imgcls.run.plan import resolve_plan
from imgcls.run.train import run
from imgcls.training.optimizer import build_optimizer, parameter_groups
from imgcls.training.scheduler import build_scheduler
from imgcls.training.sync_batchnorm import TimmSyncBatchNorm
from tests.conftest import compose_config, read_report, tiny_overrides


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("start", [None, 0.0])
def test_rmsprop_tf_is_tensorflows_update(start: float | None, fused: bool) -> None:
    """TF's ApplyRMSProp: ms = rho ms + (1 - rho) g^2; mom = momentum mom + lr g / sqrt(ms + eps); w -= mom.
    ms starts where recipe.rmsprop_initial_square_avg says: the TF2 recipe's 0 (Keras' slot), or with null
    timm's 1 (TF1's slot); fused=False is timm's own RMSpropTF (the optimizer when gradients are clipped)."""
    recipe = compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp"]).recipe
    assert recipe.rmsprop_initial_square_avg == 0.0
    recipe.rmsprop_initial_square_avg = start
    lr, rho, momentum, eps = 0.1, recipe.rmsprop_alpha, recipe.momentum, recipe.rmsprop_eps
    grads = [torch.tensor([1e-3, -2e-2]), torch.tensor([5e-3, 4e-2])]
    weight = nn.Parameter(torch.tensor([0.5, -0.5]))
    optimizer = build_optimizer([{"params": [weight], "weight_decay": 0.0}], recipe, lr, fused=fused)
    ms = torch.ones(2) if start is None else torch.full((2,), start)
    mom, expected = torch.zeros(2), weight.detach().clone()
    for grad in grads:
        weight.grad = grad.clone()
        optimizer.step()
        ms = rho * ms + (1 - rho) * grad**2
        mom = momentum * mom + lr * grad / torch.sqrt(ms + eps)
        expected -= mom
    assert torch.allclose(weight.detach(), expected, rtol=1e-6, atol=1e-9)


def test_torchs_rmsprop_adds_eps_outside_the_root() -> None:
    """With TF2's eps 1e-3 torch's RMSprop (eps outside the root, its square average from 0) takes a first step
    ~30 times TF's from timm's start at 1."""
    recipe = compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp"]).recipe
    lr, rho, eps = 0.1, recipe.rmsprop_alpha, recipe.rmsprop_eps
    grads = [torch.tensor([1e-3, -2e-2])]
    torch_style = OmegaConf.merge(recipe, {"optimizer": "rmsprop", "rmsprop_initial_square_avg": None})
    other = nn.Parameter(torch.tensor([0.5, -0.5]))
    torch_rmsprop = build_optimizer([{"params": [other], "weight_decay": 0.0}], torch_style, lr)
    other.grad = grads[0].clone()
    torch_rmsprop.step()
    tf_first_step = lr * grads[0] / torch.sqrt(rho + (1 - rho) * grads[0] ** 2 + eps)
    torch_first_step = torch.tensor([0.5, -0.5]) - other.detach()
    assert torch_first_step[0] > 30 * tf_first_step[0]  # eps outside the root: a small gradient takes a huge step


def _layer_kind(module: nn.Module) -> str:
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return "batch norm"
    if isinstance(module, nn.Conv2d):
        return "depthwise conv" if module.groups == module.in_channels > 1 else "conv"
    if isinstance(module, nn.Linear):
        return "dense"
    return type(module).__name__


def _decayed_by_layer_kind(net: nn.Module, recipe: object, weight_decay: float) -> dict[tuple[str, str], set[bool]]:
    """(layer kind, parameter) -> whether such parameters are decayed, over every parameter of the network."""
    groups = parameter_groups(net, weight_decay, recipe.weight_decay_on)  # type: ignore[attr-defined]
    decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert sum(len(g["params"]) for g in groups) == len(list(net.parameters()))
    seen: dict[tuple[str, str], set[bool]] = {}
    for module in net.modules():
        for name, param in module.named_parameters(recurse=False):
            seen.setdefault((_layer_kind(module), name), set()).add(id(param) in decayed)
    return seen


# NVIDIA TF2 EfficientNet (DeepLearningExamples 729963dd): conv2d_block.py:57-58 gives every Conv2D a
# kernel_regularizer and bias_regularizer (biases exist on the SE convs only, mb_conv_block.py:96-109),
# efficientnet_model_v1.py:231-232 the same for the Dense head. Depthwise convs (conv2d_block.py:63-64) get
# kernel_regularizer too, but Keras' DepthwiseConv2D regularizes its kernel with depthwise_regularizer only
# (keras/layers/convolutional.py:2376-2391, 2411-2416 at keras-team/keras 751469e8, the Keras 2.6 code of NVIDIA's
# 21.09 container); BN layers get no regularizer.
TF2_DECAYED = {
    ("conv", "weight"): True,
    ("conv", "bias"): True,
    ("depthwise conv", "weight"): False,
    ("batch norm", "weight"): False,
    ("batch norm", "bias"): False,
    ("dense", "weight"): True,
    ("dense", "bias"): True,
}


@pytest.mark.parametrize("sync_bn", [False, True])
def test_tf2_efficientnet_decays_what_nvidias_keras_model_regularizes(sync_bn: bool) -> None:
    cfg = compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp"])
    net = _network("tf2_efficientnet_b0_8xa100_amp")
    if sync_bn:  # the TF2 experiments train with sync BN: the optimizer sees the converted network
        net = TimmSyncBatchNorm().apply(net)
    assert _decayed_by_layer_kind(net, cfg.recipe, 1e-5) == {k: {v} for k, v in TF2_DECAYED.items()}


def test_tf1_decays_every_trainable_but_batch_norm() -> None:
    """TF1/model/resnet.py:283-293 (DeepLearningExamples 729963dd): l2 on every trainable variable whose name has no
    "batchnorm"/"batch_norm"/"batch_normalization" ("bias" is commented out there): the FC bias is decayed."""
    for name in ("tf1_resnet50_dgxa100_amp_90e", "tf1_resnet50_dgx1v_amp_250e"):
        cfg = compose_config([f"experiment={name}"])
        seen = _decayed_by_layer_kind(_network(name), cfg.recipe, 1e-4)
        assert seen == {
            ("conv", "weight"): {True},
            ("batch norm", "weight"): {False},
            ("batch norm", "bias"): {False},
            ("dense", "weight"): {True},
            ("dense", "bias"): {True},
        }


def _tf2_net_and_steps() -> tuple[nn.Sequential, list[list[torch.Tensor]]]:
    """One layer of each kind TF2's EfficientNet has (conv with bias as its SE convs, BN, depthwise, dense) with
    weights of order 1, and three steps of gradients small enough that the weight decay term shows."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(4, 8, 1), nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3, groups=8, bias=False),
                        nn.Flatten(), nn.Linear(8, 3))  # fmt: skip
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn_like(p))
    return net, [[1e-4 * torch.randn_like(p) for p in net.parameters()] for _ in range(3)]


def _tf2_recipe_steps(net: nn.Module, steps: list[list[torch.Tensor]], lr: float) -> DictConfig:
    """The TF2 experiment's optimizer on its parameter groups, as the recipe builds it (its square average started
    at Keras' zeros), stepped through `steps`."""
    cfg = compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp"])
    recipe, plan = cfg.recipe, resolve_plan(cfg, check_devices=False)
    optimizer = build_optimizer(parameter_groups(net, plan.weight_decay, recipe.weight_decay_on), recipe, lr)
    for grads in steps:
        for p, grad in zip(net.parameters(), grads):
            p.grad = grad.clone()
        optimizer.step()
    return recipe


NVIDIA_TF2_L2 = 5e-6  # --weight_decay default (TF2/utils/cmdline_helper.py:133), into tf.keras.regularizers.l2


def test_tf2_optimizer_steps_as_keras_rmsprop_with_l2_regularizers() -> None:
    """NVIDIA TF2: tf.keras.optimizers.RMSprop (utils/optimizer_factory.py:264-271) on a loss carrying Keras
    l2(c) = c sum(w^2) terms on the tensors of TF2_DECAYED. TF's documented update, with g = dL/dw + 2 c w on a
    regularized tensor: ms = rho ms + (1 - rho) g^2; mom = momentum mom + lr g / sqrt(ms + eps); w -= mom."""
    net, steps = _tf2_net_and_steps()
    conv, dense = net[0], net[4]
    regularized = {id(p) for p in (conv.weight, conv.bias, dense.weight, dense.bias)}
    params = list(net.parameters())
    expected = [p.detach().clone() for p in params]
    lr = 0.1
    recipe = _tf2_recipe_steps(net, steps, lr)
    rho, momentum, eps, c = recipe.rmsprop_alpha, recipe.momentum, recipe.rmsprop_eps, NVIDIA_TF2_L2
    ms = [torch.zeros_like(p) for p in params]  # Keras' RMSprop slots start at 0
    mom = [torch.zeros_like(p) for p in params]
    for grads in steps:
        for i, (p, grad) in enumerate(zip(params, grads)):
            g = grad + 2 * c * expected[i] if id(p) in regularized else grad
            ms[i] = rho * ms[i] + (1 - rho) * g**2
            mom[i] = momentum * mom[i] + lr * g / torch.sqrt(ms[i] + eps)
            expected[i] = expected[i] - mom[i]
    for p, want in zip(params, expected):
        assert torch.allclose(p.detach(), want, rtol=1e-6, atol=1e-9)


# Run by TensorFlow itself: a Keras 2 model with NVIDIA TF2's layer arguments, three RMSprop steps on a linear data
# loss (gradient G) plus the model's l2 losses. Parameters travel flat: the update is elementwise, so any reshape
# of a torch tensor into the Keras variable's shape pairs the same numbers.
KERAS_SCRIPT = """
import json, sys
import numpy as np
import tf_keras as keras
import tensorflow as tf
job = json.load(sys.stdin)
l2 = lambda: keras.regularizers.l2(job["c"])
reg = dict(kernel_regularizer=l2(), bias_regularizer=l2())  # TF2/model/blocks/conv2d_block.py:57-58
model = keras.Sequential([
    keras.layers.Conv2D(8, 1, use_bias=True, **reg),
    keras.layers.BatchNormalization(),
    keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False, **reg),  # conv2d_block.py:63-64
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(3, **reg),  # TF2/model/efficientnet_model_v1.py:228-232
])
model(tf.zeros([1, 5, 5, 4]))
variables = model.trainable_variables
as_var = lambda flat, v: np.reshape(np.array(flat, np.float32), v.shape)
for v, flat in zip(variables, job["weights"]):
    v.assign(as_var(flat, v))
opt = keras.optimizers.legacy.RMSprop(job["lr"], rho=job["rho"], momentum=job["momentum"], epsilon=job["eps"])
for grads in job["grads"]:
    with tf.GradientTape() as tape:
        data = tf.add_n([tf.reduce_sum(v * as_var(g, v)) for v, g in zip(variables, grads)])
        loss = data + tf.add_n(model.losses)
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
print(json.dumps({"losses": len(model.losses), "weights": [v.numpy().reshape(-1).tolist() for v in variables]}))
"""


@pytest.mark.skipif(not os.environ.get("IMGCLS_TF_PYTHON"), reason="set IMGCLS_TF_PYTHON to a python with tensorflow")
def test_tf2_optimizer_steps_as_tensorflow_keras_does() -> None:
    """Opt-in: the comparison above against TensorFlow's own Keras 2 (tf_keras, its legacy RMSprop = OptimizerV2,
    the optimizer of TF 2.6 that NVIDIA ran). IMGCLS_TF_PYTHON: a python with tensorflow-cpu and tf_keras."""
    net, steps = _tf2_net_and_steps()
    lr = 0.1
    cfg = compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp"])
    job = {
        "c": NVIDIA_TF2_L2, "lr": lr, "rho": cfg.recipe.rmsprop_alpha, "momentum": cfg.recipe.momentum,
        "eps": cfg.recipe.rmsprop_eps, "weights": [p.detach().reshape(-1).tolist() for p in net.parameters()],
        "grads": [[g.reshape(-1).tolist() for g in grads] for grads in steps],
    }  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    command = [os.environ["IMGCLS_TF_PYTHON"], "-c", KERAS_SCRIPT]
    done = subprocess.run(command, input=json.dumps(job), capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    keras = json.loads(done.stdout.strip().splitlines()[-1])
    assert keras["losses"] == 4  # conv kernel + bias, dense kernel + bias: none from the depthwise kernel
    _tf2_recipe_steps(net, steps, lr)
    for p, want in zip(net.parameters(), keras["weights"]):
        assert torch.allclose(p.detach().reshape(-1), torch.tensor(want), rtol=1e-5, atol=1e-7)


# NVIDIA TF2's AutoAugment (DeepLearningExamples 729963dd): dataloader/augment.py:753-757 AutoAugment(
# augmentation_name='v0', cutout_const=100, translate_const=250), built with no arguments by the scripts (no
# --autoaugmentation_name / --translate_const, utils/cmdline_helper.py:246-259, runtime/runner_utils.py:93-110).
# The first sub-policies of policy_v0, augment.py:864-868, as (op, probability, magnitude):
NVIDIA_V0_FIRST = [
    [("Equalize", 0.8, 1), ("ShearY", 0.8, 4)],
    [("Color", 0.4, 9), ("Equalize", 0.6, 3)],
    [("Color", 0.4, 1), ("Rotate", 0.6, 8)],
    [("Solarize", 0.8, 3), ("Equalize", 0.4, 7)],
    [("Solarize", 0.4, 2), ("Solarize", 0.6, 2)],
]


@pytest.mark.parametrize("experiment", ["tf2_efficientnet_b0_8xa100_amp", "tf2_efficientnet_b4_8xa100_amp"])
def test_tf2_autoaugment_is_nvidias_v0(experiment: str) -> None:
    from timm.data.auto_augment import AutoAugment

    from imgcls.data.transforms import train_transform

    data = compose_config([f"experiment={experiment}", "data.backend=torchvision"]).data
    (autoaugment,) = [t for t in train_transform(data).transforms if isinstance(t, AutoAugment)]
    policy = autoaugment.policy
    assert len(policy) == 25
    assert [[(op.name, op.prob, op.magnitude) for op in sub] for sub in policy[:5]] == NVIDIA_V0_FIRST
    # augment.py:879 [('Rotate', 1.0, 7), ('TranslateY', 0.8, 9)]: TranslateY by 9 / 10 x translate_const 250
    # = 225 px (augment.py:613-614) whatever the image size; timm's v0 translates by a fraction of the image.
    translate = policy[15][1]
    assert (translate.name, translate.prob, translate.magnitude) == ("TranslateYRel", 0.8, 9)
    (fraction,) = translate.level_fn(translate.magnitude, translate.hparams)
    assert abs(fraction) * data.image_size == pytest.approx(225)
    assert all(op.kwargs["fillcolor"] == (128, 128, 128) for sub in policy for op in sub)  # augment.py:812


def test_every_v0_op_runs_and_posterize_at_no_bits_keeps_the_top_bit() -> None:
    """v0's ('Posterize', 0.8, 2) keeps int(0.8) = 0 bits in TF (TF2 dataloader/augment.py:374-377, 620-621), whose
    shift of 8 TensorFlow clamps to 7: the top bit stays (tests/test_autoaugment_ops.py). Through timm, PIL refused
    0 bits (ValueError) and the training run died."""
    from PIL import Image
    from timm.data.auto_augment import AutoAugment

    from imgcls.data.transforms import train_transform

    data = compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp", "data.backend=torchvision"]).data
    (autoaugment,) = [t for t in train_transform(data).transforms if isinstance(t, AutoAugment)]
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    for sub_policy in autoaugment.policy:
        for op in sub_policy:
            args = op.level_fn(op.magnitude, op.hparams) if op.level_fn else ()
            out = op.aug_fn(image, *args, **op.kwargs)
            assert out.size == image.size and out.mode == "RGB"
            if op.name == "Posterize" and op.magnitude == 2:
                assert np.array_equal(np.asarray(out), np.asarray(image) & 0x80)


def test_dali_refuses_an_autoaugment_policy_it_does_not_have() -> None:
    cfg = compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp", "data.backend=dali_cpu",
                          "recipe.autoaugment_policy=original"])  # fmt: skip
    with pytest.raises(ConfigError) as info:
        check_config(cfg)
    assert str(info.value) == (
        "data.autoaugment_policy=original must be v0 with data.backend=dali_cpu (DALI's AutoAugment has the v0 "
        "policy only); use data.backend=torchvision for another policy"
    )
    check_config(compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp", "data.backend=dali_cpu"]))


def test_unknown_optimizer_is_refused_in_one_line() -> None:
    cfg = compose_config(["recipe.optimizer=adam"])
    with pytest.raises(ConfigError) as info:
        check_config(cfg)
    assert str(info.value) == "recipe.optimizer=adam must be one of sgd, rmsprop, rmsprop_tf"
    # RMSprop on a recipe without its two numbers (the SGD recipes): one line, not a TypeError traceback
    with pytest.raises(ConfigError, match=r"^recipe.rmsprop_alpha=null must be set with recipe.optimizer=rmsprop_tf"):
        check_config(compose_config(["recipe.optimizer=rmsprop_tf"]))


def _network(experiment: str) -> nn.Module:
    torch.manual_seed(0)
    return build_network(compose_config([f"experiment={experiment}"]).model, num_classes=1000)


def test_tf2_init_is_keras_variance_scaling() -> None:
    """Convs: truncated normal (2 stddev) with variance 2 / fan_out, fan_out counted as Keras does (out x kh x kw
    / groups: kh x kw for a depthwise conv). Dense: uniform with variance (1/3) / fan_out, i.e. bound 1/sqrt(out)."""
    net = _network("tf2_efficientnet_b0_8xa100_amp")
    checked = 0
    for module in net.modules():
        if isinstance(module, nn.Conv2d) and module.weight.numel() >= 20000:
            w = module.weight.detach()
            fan_out = module.out_channels * w[0, 0].numel() // module.groups
            std = math.sqrt(2.0 / fan_out)
            assert w.std().item() == pytest.approx(std, rel=0.05)
            assert w.abs().max().item() <= 2 * std / 0.87962566103423978 + 1e-6  # truncated at 2 stddev
            checked += module.groups > 1
    assert checked >= 3  # depthwise convs included
    fc = net.get_classifier().weight.detach()
    bound = math.sqrt(1.0 / fc.shape[0])
    assert fc.abs().max().item() <= bound and fc.abs().max().item() > 0.99 * bound
    assert fc.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    assert not net.get_classifier().bias.detach().any()


@pytest.mark.slow
def test_tf1_init_is_truncated_variance_scaling_fan_in() -> None:
    """TF1 --weight_init=fan_in: conv and dense kernels with variance 2 / fan_in, truncated at 2 stddev."""
    net = _network("tf1_resnet50_dgx1v_amp_90e")
    for module in (net.layer3[0].conv2, net.get_classifier()):
        w = module.weight.detach()
        std = math.sqrt(2.0 / w[0].numel())  # fan_in = in x kh x kw (dense: in)
        assert w.std().item() == pytest.approx(std, rel=0.05)
        assert w.abs().max().item() <= 2 * std / 0.87962566103423978 + 1e-6


def test_tf1_se_dense_layers_are_initialized_at_scale_one() -> None:
    """TF1 SE-ResNeXt: the SE block's two dense layers take squeeze_excitation_layer's default initializer,
    variance 1 / fan_in (TF1/model/layers/squeeze_excitation_layer.py:32), not the convs' 2 / fan_in."""
    torch.manual_seed(0)
    net = build_network(compose_config(["model=se_resnext101_32x4d", "model.conv_init=tf1"]).model, num_classes=10)
    block = net.layer3[0]
    for module, scale in ((block.se.fc1, 1.0), (block.se.fc2, 1.0), (block.conv1, 2.0)):
        w = module.weight.detach()
        std = math.sqrt(scale / w[0].numel())
        assert w.std().item() == pytest.approx(std, rel=0.05), module
        assert w.abs().max().item() <= 2 * std / 0.87962566103423978 + 1e-6


def test_tf1_resnext_grouped_convs_take_tfs_default_glorot_uniform() -> None:
    """TF1 ResNeXt's grouped 3x3 filter is a tf.get_variable without an initializer (TF1/model/blocks/
    conv2d_block.py:61-65): Glorot uniform, limit sqrt(6 / (fan_in + fan_out)) with fan_in = 9 x C/groups and
    fan_out = 9 x C, about a sixth of the variance-scaling stddev the other convs get."""
    torch.manual_seed(0)
    net = build_network(compose_config(["model=resnext101_32x4d", "model.conv_init=tf1"]).model, num_classes=10)
    conv = net.layer2[1].conv2  # 3x3, 256 channels in 32 groups
    assert conv.groups == 32
    w = conv.weight.detach()
    limit = math.sqrt(6.0 / (9 * 256 // 32 + 9 * 256))
    assert w.abs().max().item() <= limit and w.abs().max().item() > 0.99 * limit
    assert w.std().item() == pytest.approx(limit / math.sqrt(3), rel=0.05)


@pytest.mark.slow
def test_stagewise_recipe_ramps_size_and_randaugment_in_equal_stages() -> None:
    """recipe=tf2_efficientnet_stagewise on a TF2 experiment: 4 stages of 500 // 4 epochs, sizes
    int(128 + (224 - 128) (stage + 1) / 4) and magnitudes linspace(5, 15, 4), as TF2's runner.py."""
    from imgcls.data.progressive import schedule_from_config

    cfg = compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp", "recipe=tf2_efficientnet_stagewise"])
    check_config(cfg)
    assert (cfg.recipe.optimizer, cfg.recipe.epochs, cfg.data.augment) == ("rmsprop_tf", 500, "randaugment")
    schedule = schedule_from_config(cfg.data)
    assert [schedule.size(e) for e in (0, 124, 125, 250, 375, 499)] == [152, 152, 176, 200, 224, 224]
    assert [schedule.magnitude(e) for e in (0, 125, 250, 375)] == [5, 8, 12, 15]
    assert schedule.final_size == cfg.model.image_size  # the last stage trains and validates at full size
    # Every other recipe trains at one size unless data.progressive says otherwise.
    for recipe in ("90e", "efficientnet", "tf1_90e", "tf2_efficientnet"):
        assert schedule_from_config(compose_config([f"recipe={recipe}"]).data) is None


def test_tf1_cosine_runs_over_all_steps_warmup_included() -> None:
    """TF1 --cosine_lr: linear warmup from 0, then tf.train.cosine_decay(lr, global_step, total steps), the
    cosine's clock starting at step 0, not at the warmup's end (90 epochs x 10 steps, 8 warmup epochs)."""
    total, warmup, base = 900, 80, 2.048
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=base)
    scheduler = build_scheduler(optimizer, total, warmup, 0.0, "cosine_tf1", epochs=90)
    lrs = {}
    for step in range(0, total + 1):  # how ClassificationModule.lr_scheduler_step drives it
        scheduler.step_update(num_updates=step)
        lrs[step] = optimizer.param_groups[0]["lr"]
    assert lrs[40] == pytest.approx(base * 40 / 80)  # warmup
    for step in (80, 450, 899):
        assert lrs[step] == pytest.approx(base * 0.5 * (1 + math.cos(math.pi * step / total)), rel=1e-9)
    assert lrs[80] == pytest.approx(0.981 * base, abs=1e-3)  # below the peak when the warmup ends


@pytest.mark.slow
def test_tf2_recipe_trains_with_tf_rmsprop_tf_init_and_ema(image_folder: Path, tmp_path: Path) -> None:
    """The one real run: debug=tiny with the TF2 recipe and TF2's init reaches the training loop with timm's
    RMSpropTF and reports the EMA weights (val_ema.*) next to the raw ones, as NVIDIA's TF2 runs do."""
    overrides = tiny_overrides(image_folder, "recipe=tf2_efficientnet", "model.conv_init=tf2", "recipe.epochs=1",
                               "recipe.warmup_epochs=0", "recipe.global_batch_size=8")  # fmt: skip
    run(compose_config(overrides, run_dir=tmp_path))
    epoch = read_report(tmp_path)["epochs"][-1]
    assert math.isfinite(epoch["train.loss"]) and "val_ema.top1" in epoch and "val.top1" in epoch
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    group = state["optimizer_states"][0]["param_groups"][0]
    assert group["lr_in_momentum"] is True and group["eps"] == 1e-3 and group["alpha"] == 0.9  # RMSpropTF's


@pytest.mark.slow
def test_tf2_ema_decay_ramps_as_tensorflows_dynamic_decay() -> None:
    """TF2 HvdMovingAverage(dynamic_decay=True): decay = min(0.9999, (1 + t) / (10 + t)), t = optimizer.iterations
    after the step (1 at the first), in float32 (tests/test_ema_ramp.py checks it bit for bit). A fixed decay is
    timm's."""
    from imgcls.training.module import ClassificationModule

    cfg = compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp", "model=resnet18"])
    recipe = OmegaConf.to_container(cfg.recipe, resolve=True)
    module = ClassificationModule(OmegaConf.to_container(cfg.model, resolve=True), recipe, {"lr": 0.1}, ["a", "b"])
    for step in (1, 2, 3, 10, 1000, 100_000):
        assert module.ema.get_decay(step) == pytest.approx(min(recipe["ema_decay"], (1 + step) / (10 + step)))
    fixed = ClassificationModule(OmegaConf.to_container(cfg.model, resolve=True),
                                 {**recipe, "ema_dynamic_decay": False}, {"lr": 0.1}, ["a", "b"])  # fmt: skip
    assert fixed.ema.get_decay(3) == recipe["ema_decay"] == 0.9999


@pytest.mark.parametrize(
    "experiment", ["tf1_resnet50_dgx1v_amp_250e", "tf2_efficientnet_b4_8xa100_amp", "resnet50_dgxa100_amp_250e"]
)
def test_mixup_draws_one_lambda_per_sample_for_the_tf_recipes(experiment: str) -> None:
    """TF1 (model/resnet.py:157-165) and TF2 (dataloader/dataset_factory.py:118-125) draw a Beta lambda per
    sample and mix it with the reversed batch; NVIDIA PyTorch (image_classification/mixup.py:22) one per batch
    (DeepLearningExamples 729963dd). Sample i is the constant image i: its mixed value gives its lambda."""
    from imgcls.training.module import ClassificationModule

    cfg = compose_config([f"experiment={experiment}", "model=resnet18"])
    recipe = OmegaConf.to_container(cfg.recipe, resolve=True)
    assert recipe["mixup"] == 0.2
    module = ClassificationModule(OmegaConf.to_container(cfg.model, resolve=True), recipe, {"lr": 0.1},
                                  [str(i) for i in range(10)])  # fmt: skip
    module.train()
    n = 8
    images = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, 4, 4).contiguous()
    np.random.seed(0)
    mixed, _, targets = module._mix(images, torch.arange(n))
    own, partner = torch.arange(n).float(), torch.arange(n).flip(0).float()
    lam = (mixed[:, 0, 0, 0] - partner) / (own - partner)
    smoothing = recipe["label_smoothing"]
    assert torch.allclose(targets[torch.arange(n), torch.arange(n)], lam * (1 - smoothing) + smoothing / 10, atol=1e-5)
    per_sample = recipe["mixup_mode"] == "elem"
    assert per_sample == experiment.startswith(("tf1_", "tf2_"))
    assert (len(set(lam.round(decimals=5).tolist())) > 1) is per_sample


@pytest.mark.parametrize("name", ["rmsprop_tf", "rmsprop"])
def test_fp16_overflowed_step_is_skipped_on_the_device(name: str) -> None:
    """RMSprop under GradScaler gets the found-inf flag as a tensor (no .item()): an overflowed step leaves
    weights and state as they were; a clean one is the optimizer's own step on the unscaled gradients."""
    recipe = OmegaConf.merge(compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp"]).recipe, {"optimizer": name})
    make = lambda: nn.Parameter(torch.tensor([0.5, -0.5, 0.25]))  # noqa: E731
    weight, reference = make(), make()
    optimizer = build_optimizer([{"params": [weight], "weight_decay": 1e-5}], recipe, 0.1)
    assert getattr(optimizer, "_step_supports_amp_scaling", False)
    plain = build_optimizer([{"params": [reference], "weight_decay": 1e-5}], recipe, 0.1, fused=False)
    assert not getattr(plain, "_step_supports_amp_scaling", False)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    item_calls = []
    real_item = torch.Tensor.item

    def item(self: torch.Tensor) -> float:
        item_calls.append(self)
        return real_item(self)

    for grad in ([1e-3, -2e-2, 3e-3], [float("inf"), 1.0, 0.0], [5e-3, 4e-2, -1e-3], [float("nan"), 0.0, 0.0]):
        scale = float(scaler.scale(torch.ones(())))  # (the first call makes the scale tensor)
        before = (weight.detach().clone(), {k: v.clone() for k, v in optimizer.state[weight].items()})
        weight.grad = torch.tensor(grad) * scale
        torch.Tensor.item = item
        try:
            scaler.step(optimizer)
        finally:
            torch.Tensor.item = real_item
        scaler.update()
        if all(math.isfinite(g) for g in grad):
            reference.grad = torch.tensor(grad)
            plain.step()
            assert torch.allclose(weight, reference)
        else:  # skipped: nothing moved, nothing became non-finite
            assert torch.equal(weight.detach(), before[0]) and torch.isfinite(weight).all()
            for key, value in optimizer.state[weight].items():
                if key != "step" and key in before[1]:
                    assert torch.equal(value, before[1][key]), key
        assert item_calls == []
