"""The EMA copy of the network: timm's ModelEmaV3, with the per-step walk over the network done once."""

from __future__ import annotations

from typing import Any

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
