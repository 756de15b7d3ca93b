"""Precision: Lightning's precision plugins, NVIDIA's loss scaling, TF32 switches, the CPU fallback."""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch.plugins.precision import MixedPrecision

log = logging.getLogger(__name__)


def set_tf32(enabled: bool) -> None:
    """TF32 matmul and cuDNN on or off, explicitly (PyTorch >= 1.12 defaults matmul TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    torch.set_float32_matmul_precision("high" if enabled else "highest")


def resolve_precision(cfg: Any, accelerator: str) -> tuple[str | None, list[Any]]:
    """Return (Trainer precision, plugins). AMP without CUDA falls back to bf16 with a warning."""
    name = cfg.lightning
    uses_cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if name == "16-mixed" and not uses_cuda:
        log.warning("precision=amp (fp16) needs a CUDA GPU; this run uses bf16 autocast on %s instead", accelerator)
        return "bf16-mixed", []
    set_tf32(bool(cfg.tf32))
    if name == "16-mixed" and cfg.get("loss_scale"):
        scale = cfg.loss_scale
        scaler = torch.amp.GradScaler(
            "cuda",
            init_scale=float(scale.init_scale),
            growth_factor=float(scale.growth_factor),
            backoff_factor=float(scale.backoff_factor),
            growth_interval=int(scale.growth_interval),
        )
        return None, [MixedPrecision("16-mixed", device="cuda", scaler=scaler)]
    return name, []
