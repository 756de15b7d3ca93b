"""The lightning.Trainer of a run: the user's trainer.* arguments plus what imgcls derives from other keys
(precision plugins, DDP, sync BN, SLURM, atomic checkpoint files, accumulation)."""

from __future__ import annotations

import inspect
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.plugins.environments import SLURMEnvironment
from omegaconf import DictConfig

from imgcls.callbacks.preemption import without_lightning_signal_handling
from imgcls.config.choices import IMGCLS_TRAINER_ARGS
from imgcls.errors import ConfigError
from imgcls.run.hook_dispatch import dispatch_cheaply
from imgcls.run.plan import RunPlan
from imgcls.training.checkpoint import AtomicCheckpointIO
from imgcls.training.precision import resolve_precision
from imgcls.training.sync_batchnorm import TimmSyncBatchNorm
from imgcls.typed_config import to_dict


def check_trainer_args(trainer_args: dict[str, Any]) -> None:
    """One line for a trainer.X that lightning.Trainer does not take, or that imgcls sets itself."""
    allowed = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"} - set(IMGCLS_TRAINER_ARGS)
    for key in trainer_args:
        if key in IMGCLS_TRAINER_ARGS:
            instead = IMGCLS_TRAINER_ARGS[key]
            raise ConfigError(f"trainer.{key} is set by imgcls" + (f"; use {instead}" if instead else ""))
        if key not in allowed:
            names = ", ".join(sorted(allowed))
            raise ConfigError(f"trainer.{key} is not a lightning.Trainer argument; allowed: {names}")


def build_trainer(cfg: DictConfig, plan: RunPlan, callbacks: list[L.Callback], loggers: list[Any]) -> L.Trainer:
    trainer_args = to_dict(cfg.trainer, resolve=True)
    check_trainer_args(trainer_args)
    precision, plugins = resolve_precision(cfg.precision, str(trainer_args["accelerator"]))
    if plan.world_size > 1:
        # find_unused_parameters stays off: every parameter of a classifier gets a gradient.
        if trainer_args.get("strategy") in (None, "auto"):
            trainer_args["strategy"] = "ddp"
        if trainer_args.get("sync_batchnorm") and trainer_args["accelerator"] == "cpu":
            raise ConfigError("trainer.sync_batchnorm=true needs GPUs (torch's SyncBatchNorm is CUDA-only)")
    if trainer_args.get("benchmark") is None:
        # cuDNN autotuning on, as NVIDIA's runs set it (PyTorch main.py: cudnn.benchmark = True), except for a
        # deterministic run: autotuning may pick a different algorithm per process. Lightning leaves it off.
        trainer_args["benchmark"] = not cfg.deterministic
    # The bar and the model summary are the callbacks' (callbacks/console.py: a bar draws only on a terminal).
    # Without one Lightning would add a tqdm bar; with a summary callback it says that it skips its own summary.
    # trainer.enable_progress_bar=false: no bar, whatever callbacks.progress_bar says.
    if not trainer_args.get("enable_progress_bar", True):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    trainer_args["enable_progress_bar"] = any(isinstance(c, ProgressBar) for c in callbacks)
    trainer_args["enable_model_summary"] = False
    plugins = [*plugins, AtomicCheckpointIO()]  # write-fsync-rename (see storage.py)
    if trainer_args.get("sync_batchnorm"):  # timm's converter: keeps EfficientNet's BN+SiLU (sync_batchnorm.py)
        plugins.append(TimmSyncBatchNorm())
    if SLURMEnvironment.detect():
        # Ranks and world size from SLURM. Not Lightning's auto_requeue: its SIGUSR1 handler saves inside the
        # signal handler, where the checkpoint's collectives meet the other ranks at arbitrary points (a hang
        # under DDP). Preemption saves at a step boundary on every rank, then requeues (callbacks/preemption.py).
        plugins.append(SLURMEnvironment(auto_requeue=False))
    trainer = L.Trainer(
        **trainer_args,
        precision=precision,
        plugins=plugins,
        accumulate_grad_batches=plan.accumulation,
        # Our samplers split the samples among the ranks themselves (val without padding: exact metrics).
        use_distributed_sampler=False,
        deterministic=bool(cfg.deterministic) or None,
        default_root_dir=cfg.run_dir,
        callbacks=callbacks,
        logger=loggers or False,
        enable_checkpointing=any(isinstance(c, L.pytorch.callbacks.ModelCheckpoint) for c in callbacks),
    )
    dispatch_cheaply(trainer)  # no no-op hook calls or profiler contexts a step (run/hook_dispatch.py)
    without_lightning_signal_handling(trainer)  # imgcls's own, for the whole run (callbacks/preemption.py)
    return trainer
