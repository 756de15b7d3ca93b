"""recipe=qat: fine-tune a trained network with fake INT8 quantization, then export it with Q/DQ nodes.

The quantizers come from NVIDIA's Model Optimizer (nvidia-modelopt), the maintained successor of the
pytorch-quantization package NVIDIA's quant_main.py used: it runs on CPU as well as on GPU, trains with
straight-through gradients, and its quantizers export to ONNX QuantizeLinear/DequantizeLinear pairs, the form
TensorRT builds INT8 engines from and ONNX Runtime runs on CPU. (PyTorch's own torch.ao QAT is deprecated in favour
of torchao, whose QAT targets linear layers of language models and exports no Q/DQ ONNX for convolutions.)

Quantization is NVIDIA's (TF1 `--quantize --symmetric`, modelopt's INT8 default): symmetric signed 8 bits, weights
per output channel, activations per tensor. The activation ranges are calibrated by their maximum over
`recipe.qat.calibration_images` training images read with the val preprocessing (quantization/calibration.py),
the same images on every rank, so every rank starts from the same scales without a collective.

A QAT checkpoint carries the quantizers' layout (`quantizer_state`) next to its weights; models/trained.py
rebuilds it before loading the weights, so evaluate.py, classify and export read QAT checkpoints like any other.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from imgcls.distributed import launcher_local_rank

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
    from imgcls.errors import ConfigError

    try:
        with _quiet():
            import modelopt.torch.opt as mto
            import modelopt.torch.quantization as mtq
    except ImportError:
        raise ConfigError(
            "recipe=qat needs NVIDIA Model Optimizer: pip install 'imgcls[export]' (nvidia-modelopt)"
        ) from None
    return mtq, mto


def quantize(net: nn.Module, batches: Iterable[torch.Tensor], device: torch.device | None = None) -> nn.Module:
    """Insert the fake quantizers into net (in place) and calibrate their ranges on batches (float NCHW). A GPU
    `device` is made the process's current one first, before modelopt is imported or anything is moved
    (calibration_device says why)."""
    device = device or torch.device("cpu")
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device.index)
    mtq, _ = _modelopt()
    was_training = net.training
    home = next(net.parameters()).device

    def forward_loop(model: nn.Module) -> None:
        model.eval()  # BN's running statistics stay those of the trained network
        with torch.no_grad():
            for images in batches:
                model(images.to(device))

    net.to(device)
    with _quiet():
        net = mtq.quantize(net, mtq.INT8_DEFAULT_CFG, forward_loop)
    net.to(home).train(was_training)
    log.info("qat: %d fake quantizers (int8, per-channel weights), calibrated", count_quantizers(net))
    return net


def count_quantizers(net: nn.Module) -> int:
    return sum(1 for name, _ in net.named_buffers() if name.endswith("_quantizer._amax"))


def is_quantized(net: nn.Module) -> bool:
    return count_quantizers(net) > 0


def quantizer_state(net: nn.Module) -> dict[str, Any]:
    """What a checkpoint needs to rebuild the quantizers before its weights (and ranges) are loaded."""
    _, mto = _modelopt()
    return mto.modelopt_state(net)


def restore(net: nn.Module, state: dict[str, Any]) -> nn.Module:
    """The quantizers of a QAT checkpoint, in a freshly built network (their ranges come with the state_dict)."""
    _, mto = _modelopt()
    with _quiet():
        return mto.restore_from_modelopt_state(net, state)


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
    settings = recipe.get("qat") or {}
    return {
        "format": "onnx-qdq",
        "weights": "int8 symmetric per-channel",
        "activations": "int8 symmetric",
        "method": f"qat (recipe={recipe.get('name')}, {recipe.get('epochs')} epochs)",
        "calibration_images": settings.get("calibration_images"),
        "calibration_seed": settings.get("seed"),
        "calibration_preprocessing": "val",
        "tool": "nvidia-modelopt",
    }


def without_quantizers(net: nn.Module) -> nn.Module:
    """The QAT-fine-tuned network in float (every fake quantizer off): for `format=int8`, whose ONNX Runtime
    quantization places Q/DQ where ORT's CPU kernels fuse them (modelopt places them for TensorRT)."""
    mtq, _ = _modelopt()
    with _quiet():
        mtq.disable_quantizer(net, "*")
    return net
