"""`trainer.sync_batchnorm=true` through timm's converter, as a Lightning LayerSync plugin.

Lightning's default plugin (TorchSyncBatchNorm) calls torch's `SyncBatchNorm.convert_sync_batchnorm`,
which turns timm's `BatchNormAct2d` (EfficientNet's BN + SiLU) into a plain `SyncBatchNorm` whose forward
never applies the activation. timm's `convert_sync_batchnorm` keeps it (`SyncBatchNormAct`).

The plugin subclasses TorchSyncBatchNorm because Lightning refuses any other LayerSync next to
`Trainer(sync_batchnorm=True)`; given in `plugins`, it replaces the default one. Lightning applies it in
DDP/FSDP setup to the whole LightningModule, so the EMA copy (module.ema.module) is converted too, and
reverts it at the end of fit.
"""

from __future__ import annotations

import torch
from lightning.pytorch.plugins.layer_sync import TorchSyncBatchNorm
from timm.layers import BatchNormAct2d, convert_sync_batchnorm
from timm.layers.norm_act import SyncBatchNormAct
from torch import nn


class TimmSyncBatchNorm(TorchSyncBatchNorm):
    """Sync BN that keeps timm's fused activations (and their drop layers)."""

    def apply(self, model: nn.Module) -> nn.Module:
        return convert_sync_batchnorm(model)

    def revert(self, model: nn.Module) -> nn.Module:
        # Lightning's revert knows plain SyncBatchNorm only: it would turn SyncBatchNormAct into a BN
        # without activation again. Restore BatchNormAct2d here, the rest through Lightning's revert.
        if isinstance(model, SyncBatchNormAct):
            return _to_batchnorm_act(model, self)
        if isinstance(model, nn.SyncBatchNorm):
            return super().revert(model)
        for name, child in model.named_children():
            model.add_module(name, self.revert(child))
        return model


def _to_batchnorm_act(sync: SyncBatchNormAct, plugin: TimmSyncBatchNorm) -> BatchNormAct2d:
    plain = BatchNormAct2d(
        sync.num_features,
        eps=sync.eps,
        momentum=sync.momentum,  # type: ignore[arg-type]  # timm types it float; BatchNorm2d, its base, takes None
        affine=sync.affine,
        track_running_stats=sync.track_running_stats,
        apply_act=False,
    )
    if sync.affine:
        with torch.no_grad():
            plain.weight = sync.weight
            plain.bias = sync.bias
    plain.running_mean = sync.running_mean
    plain.running_var = sync.running_var
    plain.num_batches_tracked = sync.num_batches_tracked
    plain.training = sync.training
    plain.drop = plugin.revert(sync.get_submodule("drop"))
    plain.act = plugin.revert(sync.get_submodule("act"))
    return plain


def count_sync_batchnorm(model: nn.Module) -> tuple[int, int]:
    """(SyncBatchNorm layers, of which keep an activation): what a conversion produced."""
    syncs = [m for m in model.modules() if isinstance(m, nn.SyncBatchNorm)]
    return len(syncs), sum(isinstance(m, SyncBatchNormAct) for m in syncs)
