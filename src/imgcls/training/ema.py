"""The EMA copy of the network: timm's ModelEmaV3, with the per-step walk over the network done once, and NVIDIA's
decay ramp counted as NVIDIA's PyTorch and TF2 code count it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from timm.utils import ModelEmaV3
from torch import nn


class ModelEma(ModelEmaV3):
    """timm's ModelEmaV3 whose update does no Python work per parameter.

    timm builds its lists of tensors from two state_dict() calls every step (a Python walk over every parameter
    and buffer of both networks) and copies each integer buffer (BatchNorm's num_batches_tracked: 53 in a
    ResNet50) with a kernel of its own. `track(model)` builds the lists once, after the trainer has placed both
    networks on their device; each update is then one foreach lerp and one foreach copy. Parameters and buffers
    are updated in place by the optimizer, BatchNorm and a checkpoint restore, so the lists stay valid for the fit.
    Anything else (an untracked model, bf16 or mixed-dtype EMA tensors, foreach off) is timm's own update."""

    _tracked: tuple[nn.Module, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]] | None
    _tracked = None

    def __init__(self, model: nn.Module, decay: float, ramp: str | None = None) -> None:
        super().__init__(model, decay=decay)
        self.ramp = ramp  # None: timm's decay (the weights copied at the first update, then `decay`); else RAMPS

    def get_decay(self, step: int | None = None) -> float:
        if self.ramp is None or step is None:
            return super().get_decay(step)
        return nvidia_decay(self.decay, step, self.ramp)

    def track(self, model: nn.Module) -> None:
        lerp_ema, lerp_model, copy_ema, copy_model = [], [], [], []
        for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
            if ema_v.is_floating_point():
                lerp_ema.append(ema_v)
                lerp_model.append(model_v)
            else:
                copy_ema.append(ema_v)
                copy_model.append(model_v)
        # timm rounds bf16 EMA tensors stochastically and casts mixed dtypes: its own update does those.
        if any(e.dtype != m.dtype or e.dtype == torch.bfloat16 for e, m in zip(lerp_ema, lerp_model)):
            self._tracked = None
            return
        # A tuple, not an attribute holding the module: nn.Module would register `model` as a submodule.
        self._tracked = (model, lerp_ema, lerp_model, copy_ema, copy_model)

    def apply_update_(self, model: Any, decay: float) -> None:
        tracked = self._tracked
        if tracked is None or tracked[0] is not model or not self.foreach:
            super().apply_update_(model, decay)
            return
        _, lerp_ema, lerp_model, copy_ema, copy_model = tracked
        torch._foreach_lerp_(lerp_ema, lerp_model, weight=1.0 - decay)
        if copy_ema:
            torch._foreach_copy_(copy_ema, copy_model)


RAMPS = ("pytorch", "tf2")  # recipe.ema_ramp


def nvidia_decay(mu: float, step: int, ramp: str) -> float:
    """The decay NVIDIA's EMA averages with at the update after optimizer step `step` (1 = the first step: Lightning's
    global_step once the step is taken), min(mu, (1 + t) / (10 + t)), its t and arithmetic as each framework has them.
    There is no copy of the weights at the first update: the average starts from the network as it was built.

    pytorch: PYT/image_classification/models/common.py:196-200 (EMA.__call__, Python floats), t = the 0-based index
    of the batch (training.py:184, :226 `step + i`): 0 at the first update. NVIDIA updates after every micro-batch
    (with gradient accumulation t counts micro-batches); imgcls updates once per optimizer step and counts those.
    tf2: TF2/utils/optimizer_factory.py:149-153 calls update_average(optimizer.iterations) after apply_gradients has
    counted the step, so t = 1 at the first update, in float32 (:195-202: tf.cast(step, tf.float32), tf.minimum with
    the float32 hyperparameter)."""
    if ramp == "pytorch":
        t = step - 1
        return min(mu, (1.0 + t) / (10 + t))
    if ramp == "tf2":
        t32 = np.float32(step)
        return float(np.minimum(np.float32(mu), (np.float32(1.0) + t32) / (np.float32(10.0) + t32)))
    raise ValueError(f"recipe.ema_ramp={ramp}; allowed: {', '.join(RAMPS)}")
