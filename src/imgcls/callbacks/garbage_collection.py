"""The garbage collector during training: what setup made is frozen out of its passes.

By the first step a run's process tracks hundreds of thousands of container objects (torch, Lightning, Hydra, timm
and the run's own setup), nearly all alive until the process ends. Python's full collection walks every one of them,
on whichever step it lands, and under DDP the other ranks wait at the next all-reduce for the rank that collected
(Megatron-LM's `--manual-gc` exists for this). At the start of training the garbage is collected once and the
survivors are moved to the permanent generation (`gc.freeze()`, the Python documentation's advice before a fork): a
full collection then walks only what training made since (the two times: docs/benchmarks.md), and the data loader
workers forked after it do not write to the frozen objects' pages when they collect. At the end of training (or on
an exception) they are unfrozen: a multirun's next job in the same process starts from a collector that sees
everything again.
"""

from __future__ import annotations

import gc

import lightning as L


class FreezeSetupObjects(L.Callback):
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        gc.collect()
        gc.freeze()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        gc.unfreeze()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        gc.unfreeze()
