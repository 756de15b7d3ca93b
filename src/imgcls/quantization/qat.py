"""recipe=qat: fine-tune a trained network with fake INT8 quantization, then export it with Q/DQ nodes.

The quantizers come from NVIDIA's Model Optimizer (nvidia-modelopt), the maintained successor of the
pytorch-quantization package NVIDIA's quant_main.py used: it runs on CPU as well as on GPU, trains with
straight-through gradients, and its quantizers export to ONNX QuantizeLinear/DequantizeLinear pairs, the form
TensorRT builds INT8 engines from and ONNX Runtime runs on CPU. (PyTorch's own torch.ao QAT is deprecated in favour
of torchao, whose QAT targets linear layers of language models and exports no Q/DQ ONNX for convolutions.)

Quantization is NVIDIA's (TF1 `--quantize --symmetric`, modelopt's INT8 default): symmetric signed 8 bits, weights
per output channel, activations per tensor. The activation ranges are calibrated on `recipe.qat.calibration_images`
training images (quantization/calibration.py; val preprocessing, or the training augmentation as NVIDIA's PyTorch
quant_main.py), by their maximum or, as NVIDIA's PyTorch code, a histogram's 99.99th percentile
(`recipe.qat.calibrator`), the same images on every rank, so every rank starts from the same scales without a
collective. `recipe.qat.quantizers=nvidia` adds the quantizers of NVIDIA's efficientnet-quant networks
(quantization/placement.py).

A QAT checkpoint carries the quantizers' layout (`quantizer_state`) next to its weights; inference/trained.py
rebuilds it before loading the weights, so evaluate.py, classify and export read QAT checkpoints like any other.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import logging
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from imgcls.config.compose import group_option
from imgcls.distributed import launcher_local_rank
from imgcls.errors import ConfigError
from imgcls.quantization.placement import add_quantizers, extra_quantizer_names, placement_of
from imgcls.quantization.placement import describe as describe_placement
from imgcls.typed_config import to_dict

log = logging.getLogger(__name__)

# The checkpoint key of the quantizers' layout (modelopt's modelopt_state: which modules, which settings).
STATE_KEY = "quantizers"


@contextlib.contextmanager
def _quiet() -> Any:
    """modelopt prints ("Inserted N quantizers") and its import warns about CUDA and transformers: imgcls logs
    what matters itself, so a CPU run's console stays free of lines that read like problems."""
    cpp_log = logging.getLogger("torch.utils.cpp_extension")
    level = cpp_log.level
    cpp_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        cpp_log.setLevel(level)


def _modelopt() -> tuple[Any, Any]:
    try:
        with _quiet():
            import modelopt.torch.opt as mto
            import modelopt.torch.quantization as mtq
    except ImportError:
        raise ConfigError(
            "recipe=qat needs NVIDIA Model Optimizer: pip install 'imgcls[export]' (nvidia-modelopt)"
        ) from None
    return mtq, mto


PLACEMENT_KEY = "imgcls_quantizers"  # in the checkpoint's quantizer state: choices.QUANTIZER_SETS


def quantize(
    net: nn.Module,
    batches: Iterable[torch.Tensor],
    device: torch.device | None = None,
    calibrator: str = "max",
    percentile: float = 99.99,
    quantizers: str = "conv_linear",
) -> nn.Module:
    """Insert the fake quantizers into net (in place) and calibrate their ranges on batches (float NCHW). A GPU
    `device` is made the process's current one first, before modelopt is imported or anything is moved
    (calibration_device says why).

    calibrator: `max`, modelopt's default (the largest |activation| seen); `percentile`, NVIDIA's quant_main.py
    (image_classification/quantization.py:22-28,113-130): activation ranges from a histogram of |activation|
    clipped at `percentile` (99.99), weights by their max per output channel (pytorch-quantization's weight
    calibrator is max; modelopt's too). quantizers: choices.QUANTIZER_SETS."""
    device = device or torch.device("cpu")
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device.index)
    mtq, _ = _modelopt()
    was_training = net.training
    home = next(net.parameters()).device
    collector = "histogram" if calibrator == "percentile" else "max"

    def forward_loop(model: nn.Module) -> None:
        model.eval()  # BN's running statistics stay those of the trained network
        with torch.no_grad():
            for images in batches:
                model(images.to(device))

    config = copy.deepcopy(mtq.INT8_DEFAULT_CFG)
    for entry in config["quant_cfg"]:  # the activations' entry, in its place (later entries disable BN's etc.)
        if entry.get("quantizer_name") == "*input_quantizer" and "cfg" in entry:
            entry["cfg"]["calibrator"] = collector
    config["algorithm"] = None  # calibrated below, once placement's quantizers are in too
    net.to(device)
    with _quiet():
        net = mtq.quantize(net, config)
        add_quantizers(net, quantizers, collector)
        if calibrator == "max":
            net = mtq.calibrate(net, algorithm="max", forward_loop=forward_loop)
        else:
            _percentile_calibrate(net, forward_loop, percentile)
    net.to(home).train(was_training)
    log.info(
        "qat: %d fake quantizers (int8, per-channel weights; %s), %s-calibrated",
        count_quantizers(net), describe_placement(quantizers), calibrator if calibrator == "max" else
        f"histogram {percentile} percentile",
    )  # fmt: skip
    return net


def _percentile_calibrate(net: nn.Module, forward_loop: Any, percentile: float) -> None:
    """NVIDIA's calibrate (quantization.py:48-130) with modelopt's quantizers: collect every enabled quantizer's
    statistics over forward_loop, then each histogram's `percentile` amax and each max calibrator's max
    (compute_amax, quantization.py:113-121). modelopt's own calibrate runs max calibrators only."""
    from modelopt.torch.quantization.calib import MaxCalibrator
    from modelopt.torch.quantization.model_calib import enable_stats_collection, weight_only_quantize
    from modelopt.torch.quantization.nn import TensorQuantizer

    enable_stats_collection(net)
    weight_only_quantize(net)  # the weights' per-channel max, from the weights themselves
    forward_loop(net)
    for module in net.modules():
        if isinstance(module, TensorQuantizer) and not module._disabled and module._calibrator is not None:
            if isinstance(module._calibrator, MaxCalibrator):
                module.load_calib_amax()
            else:
                module.load_calib_amax("percentile", percentile=float(percentile))
            module.enable_quant()
            module.disable_calib()


def count_quantizers(net: nn.Module) -> int:
    return sum(1 for name, _ in net.named_buffers() if name.endswith("_quantizer._amax"))


def is_quantized(net: nn.Module) -> bool:
    return count_quantizers(net) > 0


def quantizer_state(net: nn.Module) -> dict[str, Any]:
    """What a checkpoint needs to rebuild the quantizers before its weights (and ranges) are loaded: modelopt's
    state, less placement's quantizers (modelopt's restore refuses quantizers it did not insert), which restore
    adds again from the PLACEMENT_KEY entry."""
    _, mto = _modelopt()
    state = copy.deepcopy(mto.modelopt_state(net))
    extra = extra_quantizer_names(net)
    for _, mode in state["modelopt_state_dict"]:
        known = mode.get("metadata", {}).get("quantizer_state")
        if known is not None:
            mode["metadata"]["quantizer_state"] = {k: v for k, v in known.items() if k not in extra}
    state[PLACEMENT_KEY] = placement_of(net)
    return state


def restore(net: nn.Module, state: dict[str, Any]) -> nn.Module:
    """The quantizers of a QAT checkpoint, in a freshly built network (their ranges come with the state_dict).
    A state without PLACEMENT_KEY (written before the key existed) has modelopt's quantizers only."""
    _, mto = _modelopt()
    state = dict(state)
    placement = state.pop(PLACEMENT_KEY, "conv_linear")
    with _quiet():
        net = mto.restore_from_modelopt_state(net, state)
        add_quantizers(net, placement)
    for name in extra_quantizer_names(net):  # an amax buffer for the state_dict's range to load into
        net.get_submodule(name).amax = torch.tensor(1.0)
    return net


def calibration_device() -> torch.device:
    """This rank's GPU when there is one (calibrating ResNet50 on a CPU takes minutes), else the CPU; the GPU is
    made the process's current CUDA device too. A caller that runs before Lightning has set the device (PTQ, a
    calibration outside a fit) would otherwise leave it at its default, and every call on "the current device" (a
    tensor made on "cuda", torch.cuda.current_device() in a library) would make a CUDA context on GPU 0 from every
    rank of the node (train.py's calibration runs in configure_model, after Lightning has set it). The local rank
    is the launcher's (distributed.launcher_local_rank: LOCAL_RANK, else srun's SLURM_LOCALID), which Lightning
    picks this rank's GPU by; taken modulo the visible GPUs, for a task that sees only its own."""
    if not torch.cuda.is_available():  # these two queries make no CUDA context
        return torch.device("cpu")
    index = launcher_local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def describe(run_config: dict[str, Any]) -> dict[str, Any]:
    """The "quantization" entry of a QAT network's exports (format=int8 writes the same key for PTQ)."""
    recipe = run_config.get("recipe") or {}
    settings = stored_settings(recipe)
    return {
        "format": "onnx-qdq",
        "weights": "int8 symmetric per-channel",
        "activations": "int8 symmetric",
        "method": f"qat (recipe={recipe.get('name')}, {recipe.get('epochs')} epochs)",
        "calibration_images": settings["calibration_images"],
        "calibration_seed": settings["seed"],
        "calibration_preprocessing": settings["calibration_preprocessing"],
        "calibrator": _calibrator_name(settings),
        "quantized": describe_placement(settings["quantizers"]),
        "tool": "nvidia-modelopt",
    }


def stored_settings(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's recipe.qat over conf/recipe/qat.yaml's: a checkpoint written before a key existed ran with the
    value that file gives it (the code's value then), so that file stays the one home of each default."""
    return {**_qat_defaults(), **(recipe.get("qat") or {})}


@functools.cache
def _qat_defaults() -> dict[str, Any]:
    return to_dict(group_option("recipe", "qat").qat)


def _calibrator_name(settings: dict[str, Any]) -> str:
    if settings["calibrator"] == "max":
        return "max"
    return f"histogram, percentile {settings['percentile']}"


def without_quantizers(net: nn.Module) -> nn.Module:
    """The QAT-fine-tuned network in float (every fake quantizer off): for `format=int8`, whose ONNX Runtime
    quantization places Q/DQ where ORT's CPU kernels fuse them (modelopt places them for TensorRT)."""
    mtq, _ = _modelopt()
    with _quiet():
        mtq.disable_quantizer(net, "*")
    return net
