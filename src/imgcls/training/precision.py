"""Precision: Lightning's precision plugins, NVIDIA's loss scaling, TF32 switches, the CPU fallback."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.plugins.precision import MixedPrecision as LightningMixedPrecision
from omegaconf import DictConfig

from imgcls.config.hardware import precision_runs_as, runs_on_cuda
from imgcls.training.rmsprop import SkipsOverflowedSteps

if TYPE_CHECKING:
    # The precision names Trainer(precision=) is typed with; Lightning exports no public alias of them.
    from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT

log = logging.getLogger(__name__)


def set_tf32(enabled: bool) -> None:
    """TF32 matmul and cuDNN on or off, explicitly (PyTorch >= 1.12 defaults matmul TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    torch.set_float32_matmul_precision("high" if enabled else "highest")


def resolve_precision(cfg: DictConfig, accelerator: str) -> tuple[_PRECISION_INPUT | None, list[Any]]:
    """Return (Trainer precision, plugins).

    AMP (fp16) without CUDA falls back to bf16 with a warning: fp16 on a CPU is slow and not what a user
    asking for `precision=amp` on a laptop wants. `precision.cpu_fp16=true` asks for real fp16 autocast
    and loss scaling on the CPU instead (torch's CPU autocast and GradScaler("cpu")), so the scaler path
    NVIDIA's AMP recipes rely on runs, and is tested, without a GPU. The name is precision.lightning as the
    precision file says it, which the config checks leave to Lightning: Trainer refuses one it lacks."""
    name = cfg.lightning
    uses_cuda = runs_on_cuda(accelerator)
    device = "cuda" if uses_cuda else "cpu"
    if precision_runs_as(cfg, accelerator) != name:  # AMP's fp16 without CUDA (mode=plan says so too)
        log.warning(
            "precision=amp (fp16) needs a CUDA GPU; this run uses bf16 autocast on %s instead "
            "(precision.cpu_fp16=true runs fp16 with loss scaling on the CPU)",
            accelerator,
        )
        return "bf16-mixed", []
    set_tf32(bool(cfg.tf32))
    if name == "16-mixed":  # with loss_scale null too: NVIDIA's scaler then, not Lightning's (NVIDIA_DEFAULT_SCALE)
        scaler = grad_scaler(cfg.get("loss_scale") or NVIDIA_DEFAULT_SCALE, device)
        return None, [MixedPrecision("16-mixed", device=device, scaler=scaler)]
    return name, []


class MixedPrecision(LightningMixedPrecision):
    """Lightning's fp16 plugin, except that an optimizer which skips overflowed steps itself (SkipsOverflowedSteps:
    imgcls's RMSprop and RMSpropTF) gets its gradients unscaled by GradScaler.unscale_ after backward, as
    Lightning does for any other unfused optimizer. Left to GradScaler.step, such an optimizer gets them scaled: the
    scaler checks them for infs in a pass that multiplies by 1, and the optimizer unscales in a second pass.
    unscale_ checks and unscales in one. torch's fused SGD still unscales in its kernel.

    Named as Lightning's class: Lightning files the scaler's state in a checkpoint under the plugin's class name."""

    def optimizer_step(  # type: ignore[override]  # Lightning's own signature, which overrides Fabric's likewise
        self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        scaler = self.scaler
        if scaler is None or not isinstance(optimizer, SkipsOverflowedSteps):
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)

        def unscaling_closure() -> Any:
            result = closure()
            if result is not None or not model.automatic_optimization:  # Lightning's own test for a backward
                scaler.unscale_(optimizer)
            return result

        return super().optimizer_step(optimizer, model=model, closure=unscaling_closure, **kwargs)


class StaticGradScaler(torch.amp.GradScaler):
    """A loss scale that never changes: TF1's `--static_loss_scale` (FixedLossScale). Unlike TF1's, a step whose
    gradients overflow is still skipped. torch's GradScaler refuses growth_factor = backoff_factor = 1, so
    update() puts the scale back instead; `overflowed` (a device tensor, no host sync) tells FiniteLoss whether
    the last step was skipped, since the scale itself no longer shows it."""

    overflowed: torch.Tensor | None = None

    def update(self, new_scale: Any = None) -> None:
        if self._enabled and self._scale is not None:
            found = [f for s in self._per_optimizer_states.values() for f in s["found_inf_per_device"].values()]
            if found:
                self.overflowed = torch.stack([f.to(self._scale.device) for f in found]).sum() > 0
        super().update(self._init_scale if new_scale is None else new_scale)


# precision.loss_scale=null with fp16: the scaler NVIDIA's PyTorch main.py makes when no script passes
# --static-loss-scale: GradScaler(init_scale=args.static_loss_scale, whose default is 1, growth_factor=2,
# backoff_factor=0.5, growth_interval=100) (PYT/main.py:262-267, :477-483 at 729963dd). Lightning's own default
# (init 65536, growth every 2000 steps) is torch's, which no NVIDIA recipe ran.
NVIDIA_DEFAULT_SCALE = {"dynamic": True, "init_scale": 1.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                        "growth_interval": 100}  # fmt: skip


def grad_scaler(scale: Any, device: str) -> torch.amp.GradScaler:
    """NVIDIA's dynamic loss scaler (IC/training.py): the PyTorch recipes' "static" 128 is its initial value.
    `dynamic: false` keeps it fixed (the TF1 recipes' static loss scale, apex's static loss_scale=128 of the
    PyTorch 50-epoch runs)."""
    if scale.get("dynamic", True) is False:
        return StaticGradScaler(device, init_scale=float(scale["init_scale"]))
    return torch.amp.GradScaler(
        device,
        init_scale=float(scale["init_scale"]),
        growth_factor=float(scale["growth_factor"]),
        backoff_factor=float(scale["backoff_factor"]),
        growth_interval=int(scale["growth_interval"]),
    )
