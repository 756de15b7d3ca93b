"""`imgcls.train.run(cfg)`: resolve the run, build data, model, callbacks and loggers, and fit."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.plugins.environments import SLURMEnvironment
from omegaconf import DictConfig, OmegaConf

from imgcls.callbacks.checkpoint import checkpoint_callbacks, resolve_ckpt_path
from imgcls.callbacks.report import ReportCallback
from imgcls.callbacks.resilience import BadImageReport, FiniteLoss, Preemption, RNGState
from imgcls.callbacks.wandb_media import wandb_media_callbacks
from imgcls.checkpoint_io import AtomicCheckpointIO, check_writable
from imgcls.config_checks import check_config
from imgcls.data.datamodule import ClassificationDataModule
from imgcls.errors import CheckpointError, ConfigError
from imgcls.loggers import build_loggers, close_loggers
from imgcls.models.weights import safe_torch_load, why_unreadable
from imgcls.module import ClassificationModule
from imgcls.plan import RunPlan, fit_per_device, lookup_batch, make_plan
from imgcls.precision import resolve_precision
from imgcls.rundir import check_run_files_are_ours
from imgcls.runtime import progress_bar, world_size_of
from imgcls.seeding import RankSeed, seed_for_init
from imgcls.sync_batchnorm import TimmSyncBatchNorm

log = logging.getLogger(__name__)


def resolve_plan(cfg: DictConfig, check_devices: bool = True) -> RunPlan:
    """Per-device and global batch (config, else the hardware table), accumulation, LR and WD.

    check_devices=False skips comparing trainer.devices with this machine (for planning a GPU run
    on a CPU machine, e.g. in tests)."""
    table = OmegaConf.to_container(cfg.hardware.batch, resolve=True)
    per_device, global_batch, row_wd = lookup_batch(
        table, str(cfg.model.batch_profile), cfg.precision.memory_class, cfg.hardware.name
    )
    per_device = per_device // int(cfg.model.get("batch_divisor") or 1)
    if cfg.recipe.global_batch_size is not None:
        global_batch = int(cfg.recipe.global_batch_size)
    world_size = world_size_of(cfg.trainer, check_devices)
    if cfg.data.batch_size is not None:
        per_device = int(cfg.data.batch_size)
    else:
        per_device = fit_per_device(per_device, global_batch, world_size)
    weight_decay = cfg.recipe.weight_decay
    if weight_decay is None:
        weight_decay = row_wd if row_wd is not None else cfg.model.weight_decay
    return make_plan(
        per_device_batch=per_device,
        global_batch=global_batch,
        world_size=world_size,
        lr_per_256=float(cfg.recipe.lr_per_256),
        weight_decay=float(weight_decay),
    )


def check_resumable(ckpt_path: str, arch: str, classes: list[str]) -> None:
    """Refuse, in one line, a checkpoint of another architecture or class list before Lightning
    fails deep inside load_state_dict."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise CheckpointError(f"ckpt_path={ckpt_path} does not exist")
    try:  # mmap: only the small metadata is read, not the tensors; never code from the file (weights_only)
        meta = safe_torch_load(path, mmap=True).get("imgcls")
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise CheckpointError(f"ckpt_path={ckpt_path} is not a readable checkpoint ({why_unreadable(exc)})") from None
    if not meta:
        raise CheckpointError(f"ckpt_path={ckpt_path} is not an imgcls training checkpoint")
    if meta["arch"] != arch:
        raise CheckpointError(f"ckpt_path={ckpt_path} is for model {meta['arch']}, not {arch}; pass model=... to match")
    if list(meta["classes"]) != list(classes):
        raise CheckpointError(
            f"ckpt_path={ckpt_path} was trained on {len(meta['classes'])} classes that differ from data.root's "
            f"{len(classes)}; to fine-tune on new classes use model.weights={ckpt_path} instead"
        )


# lightning.Trainer arguments that imgcls derives from other keys (conf/trainer/default.yaml lists the rest).
IMGCLS_TRAINER_ARGS = {
    "precision": "precision=amp|bf16|tf32|fp32", "accumulate_grad_batches": "recipe.global_batch_size",
    "callbacks": "callbacks.*", "logger": "logger=...", "plugins": "precision/hardware", "deterministic":
    "deterministic=true", "enable_checkpointing": "callbacks.checkpoint", "use_distributed_sampler": None,
    "default_root_dir": "hydra.run.dir",
}  # fmt: skip


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
    trainer_args = OmegaConf.to_container(cfg.trainer, resolve=True)
    check_trainer_args(trainer_args)
    precision, plugins = resolve_precision(cfg.precision, str(trainer_args["accelerator"]))
    if plan.world_size > 1:
        # find_unused_parameters stays off: every parameter of a classifier gets a gradient.
        if trainer_args.get("strategy") in (None, "auto"):
            trainer_args["strategy"] = "ddp"
        if trainer_args.get("sync_batchnorm") and trainer_args["accelerator"] == "cpu":
            raise ConfigError("trainer.sync_batchnorm=true needs GPUs (torch's SyncBatchNorm is CUDA-only)")
    plugins = [*plugins, AtomicCheckpointIO()]  # write-fsync-rename (see checkpoint_io.py)
    if trainer_args.get("sync_batchnorm"):  # timm's converter: keeps EfficientNet's BN+SiLU (sync_batchnorm.py)
        plugins.append(TimmSyncBatchNorm())
    if SLURMEnvironment.detect():
        # Ranks and world size from SLURM. Not Lightning's auto_requeue: its SIGUSR1 handler saves inside the
        # signal handler, where the checkpoint's collectives meet the other ranks at arbitrary points (a hang
        # under DDP). Preemption saves at a step boundary on every rank, then requeues (resilience.py).
        plugins.append(SLURMEnvironment(auto_requeue=False))
    return L.Trainer(
        **trainer_args,
        precision=precision,
        plugins=plugins,
        accumulate_grad_batches=plan.accumulation,
        # Our samplers shard (train) and shard without padding (val, exact metrics) themselves.
        use_distributed_sampler=False,
        deterministic=bool(cfg.deterministic) or None,
        default_root_dir=cfg.run_dir,
        callbacks=callbacks,
        logger=loggers or False,
        enable_checkpointing=any(isinstance(c, L.pytorch.callbacks.ModelCheckpoint) for c in callbacks),
    )


def build_callbacks(cfg: DictConfig, run_dir: Path, classes: list[str]) -> tuple[list[L.Callback], ReportCallback]:
    """Every callback of a training run, in order, and its report; `mode=benchmark` runs the same ones, so
    its numbers are those of the real loop."""
    report = ReportCallback(run_dir)
    last = run_dir / "checkpoints" / "last.ckpt"
    callbacks: list[L.Callback] = [
        BadImageReport(report),  # before the report, so its rows carry the count
        # Before the report too (its skipped-step count); fp16 overflows in a row before it stops the run.
        FiniteLoss(last, report, max_consecutive_overflows=int(cfg.precision.get("max_consecutive_overflows", 10))),
        report,
        RankSeed(int(cfg.seed)),  # seed + global rank, before RNGState restores a resumed run's
        RNGState(),
        Preemption(last, slurm_requeue=SLURMEnvironment.detect()),
        *checkpoint_callbacks(cfg.callbacks.get("checkpoint"), run_dir),
        *wandb_media_callbacks(cfg, classes),  # sample images, per-class accuracy (W&B only)
    ]
    bar = progress_bar(cfg.callbacks.get("progress_bar"))
    if bar is not None:
        callbacks.append(bar)
    return callbacks, report


def run(cfg: DictConfig) -> dict[str, float]:
    """Train (or resume) one run; return the run summary of report.json."""
    check_config(cfg)  # every value, once, before anything is built (one line per bad value)
    if cfg.get("mode") == "benchmark":  # NVIDIA benchmark_training: timed iterations only
        from imgcls.bench.training import run as benchmark_training  # it imports this module

        return benchmark_training(cfg)
    run_dir = Path(cfg.run_dir)
    seed_for_init(int(cfg.seed))  # identical initial weights on every rank (seeding.py)
    plan = resolve_plan(cfg)
    ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"), run_dir)
    check_run_files_are_ours(run_dir)  # before anything is written there
    check_writable(run_dir)
    datamodule = ClassificationDataModule(cfg.data, batch_size=plan.per_device_batch, seed=int(cfg.seed))
    if ckpt_path is not None:
        check_resumable(ckpt_path, str(cfg.model.arch), datamodule.classes)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    module = ClassificationModule(
        model=resolved["model"],
        recipe=resolved["recipe"],
        plan=plan.as_dict(),
        classes=datamodule.classes,
        run_config=resolved,
    )
    if cfg.get("compile"):
        module.compile_network()

    callbacks, report = build_callbacks(cfg, run_dir, datamodule.classes)
    if resolved.get("expected"):  # NVIDIA's published result for this experiment, next to ours
        report.extra["expected"] = resolved["expected"]
    loggers = build_loggers(cfg.logger, run_dir)
    trainer = build_trainer(cfg, plan, callbacks, loggers)
    if trainer.is_global_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
        log.info("run dir %s; plan %s", run_dir, plan.as_dict())
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    finally:
        close_loggers(loggers)
    return report.summary()
