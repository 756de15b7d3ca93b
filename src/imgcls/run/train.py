"""`imgcls.run.train.run(cfg)`: one training run (or its resumption), as a plan of milestones."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from imgcls.callbacks.order import training_callbacks
from imgcls.callbacks.preemption import preemption_signals, restarted_by
from imgcls.config.checks import check_config
from imgcls.config.hardware import resolve_auto_hardware
from imgcls.data.datamodule import ClassificationDataModule
from imgcls.distributed import is_rank_zero
from imgcls.inference.trained import preprocessing_of
from imgcls.quantization.calibration import calibration_batches
from imgcls.redaction import redact
from imgcls.run.loggers import build_loggers, close_loggers
from imgcls.run.plan import resolve_plan
from imgcls.run.rundir import check_run_files_are_ours, made_by_hydra_for, remove_run_dir
from imgcls.run.trainer import build_trainer
from imgcls.seeding import seed_for_init
from imgcls.storage import write_atomic
from imgcls.training.checkpoint import check_resumable, check_writable, resume_checkpoint
from imgcls.training.module import ClassificationModule
from imgcls.typed_config import to_dict

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict[str, float]:
    """Train (or resume) one run; return the run summary of report.json."""
    # SIGTERM/SIGUSR1/SIGUSR2 are imgcls's for the whole run, setup and teardown too (callbacks/preemption.py).
    with preemption_signals():
        started = _Started(removable=_may_remove_run_dir(cfg))
        try:
            return _train(cfg, started)
        except BaseException:
            if started.removable and not started.stepped():
                remove_failed_train_dir(Path(cfg.run_dir))
            raise


@dataclass
class _Started:
    """Whether a failed run removes its run dir: it may (_may_remove_run_dir), and it made no optimizer step (its
    Trainer, once built, counts them)."""

    removable: bool
    trainer: L.Trainer | None = None

    def stepped(self) -> bool:
        return self.trainer is not None and self.trainer.global_step > 0


def _may_remove_run_dir(cfg: DictConfig) -> bool:
    """A run that fails before its first step (a mistyped path, too many devices) leaves no run dir behind, when
    Hydra made the dir for it: the dirs of a dozen mistakes hid the runs in outputs/train. A sweep's job keeps its
    dir (the sweep's results table reads each job's exit code from it); ranks other than 0 never remove it."""
    if not is_rank_zero() or HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return False
    return made_by_hydra_for(cfg.run_dir, str(cfg.task_name))


def remove_failed_train_dir(run_dir: str | Path) -> bool:
    """Remove the run dir of a train run that stopped before its first optimizer step, which Hydra made for it
    (made_by_hydra_for, read when the run started). A checkpoint or a report.json written since keeps it whole. True
    when removed."""
    for _, _, files in os.walk(run_dir):
        if any(name.endswith(".ckpt") or name == "report.json" for name in files):  # a run that got somewhere
            return False
    return remove_run_dir(run_dir)


def _train(cfg: DictConfig, started: _Started) -> dict[str, float]:
    # 1. Check: every value once, before anything is built or written (one line per bad value), of the profile
    # that fits this machine (hardware=auto: checked and planned as the profile it stands for).
    resolve_auto_hardware(cfg)
    check_config(cfg)

    # 2. Plan: batch per device, accumulation, LR and WD from the recipe and the hardware profile.
    plan = resolve_plan(cfg)

    # 3. Run dir: ours to write in, and the checkpoint to resume from, if any: ckpt_path=, or after a restart by the
    # launcher (SLURM requeue, torchrun, submitit) the run's newest checkpoint by step; never earlier over later.
    run_dir = Path(cfg.run_dir)
    check_run_files_are_ours(run_dir)
    restart = restarted_by()
    ckpt_path = resume_checkpoint(cfg.get("ckpt_path"), run_dir, restart)
    if ckpt_path is not None and cfg.get("ckpt_path") in (None, "", "null"):
        log.info("%s: resuming from %s", restart or "a requeued run", ckpt_path)
    check_writable(run_dir)

    # 4. Data.
    datamodule = ClassificationDataModule(cfg.data, batch_size=plan.per_device_batch, seed=int(cfg.seed))
    if ckpt_path is not None:
        check_resumable(ckpt_path, str(cfg.model.arch), datamodule.classes, to_dict(cfg.recipe, resolve=True))

    # 5. Model: identical initial weights on every rank (seeding.py).
    seed_for_init(int(cfg.seed))
    resolved = to_dict(cfg, resolve=True)
    module = ClassificationModule(  # the checkpoint's, CSV's, TensorBoard's and W&B's copy of the config: no secret
        model=resolved["model"], recipe=resolved["recipe"], plan=plan.as_dict(), classes=datamodule.classes,
        run_config=redact(resolved),
    )  # fmt: skip
    if cfg.recipe.get("qat"):  # recipe=qat: fake INT8 quantizers, ranges from training images (quantization/)
        qat, preprocessing = cfg.recipe.qat, preprocessing_of(cfg.data)
        module.quantize_at_setup(  # once the process group exists (ClassificationModule.configure_model)
            lambda: calibration_batches(
                cfg.data,
                preprocessing,
                qat.calibration_images,
                qat.calibration_batch_size,
                qat.seed,
                augment=qat.calibration_preprocessing == "train",
            )
        )
    if cfg.get("compile"):
        module.compile_network()

    # 6. Callbacks (their order and its reasons: callbacks/order.py) and loggers.
    callbacks, report = training_callbacks(cfg, run_dir, datamodule)
    if resolved.get("expected"):  # NVIDIA's published result for this experiment, next to ours
        report.extra["expected"] = resolved["expected"]
    loggers = build_loggers(cfg.logger, run_dir)

    # 7. Trainer.
    trainer = build_trainer(cfg, plan, callbacks, loggers)
    started.trainer = trainer
    if trainer.is_global_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
        # Renamed into place: under torchrun or srun the other ranks check this file (step 3) while rank 0 writes
        # it, and a half-written one is not an imgcls config (a resumed 2-rank run stopped on it).
        saved = OmegaConf.create(redact(resolved))  # the resolved config, credentials as ***
        write_atomic(run_dir / "config.yaml", lambda tmp: OmegaConf.save(saved, tmp))
        log.info("run dir %s; plan %s", run_dir, plan.as_dict())

    # 8. Fit.
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    finally:
        close_loggers(loggers)
    return report.summary()
