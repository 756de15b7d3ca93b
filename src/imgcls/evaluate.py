"""`imgcls.evaluate.run(cfg)`: validate a checkpoint on the val split and write NVIDIA-named metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from imgcls.callbacks.report import ReportCallback, write_json_atomic
from imgcls.data.datamodule import ClassificationDataModule
from imgcls.errors import CheckpointError
from imgcls.module import ClassificationModule
from imgcls.precision import resolve_precision


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"ckpt={path} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise CheckpointError(f"ckpt={path} is not a readable checkpoint ({type(exc).__name__})") from None
    if not isinstance(checkpoint, dict) or "imgcls" not in checkpoint or "hyper_parameters" not in checkpoint:
        raise CheckpointError(f"ckpt={path} is not an imgcls training checkpoint")
    return checkpoint


def run(cfg: DictConfig) -> dict[str, float]:
    checkpoint = load_checkpoint(cfg.ckpt)
    hparams = checkpoint["hyper_parameters"]
    train_cfg = OmegaConf.create(hparams["run_config"])
    overrides = {k: v for k, v in OmegaConf.to_container(cfg.data).items() if v is not None}
    data_cfg = OmegaConf.merge(train_cfg.data, overrides)

    module = ClassificationModule(
        model={**hparams["model"], "weights": None},
        recipe=hparams["recipe"],
        plan=hparams["plan"],
        classes=hparams["classes"],
        run_config=hparams["run_config"],
    )
    module.load_state_dict(checkpoint["state_dict"])
    if cfg.get("use_ema"):
        if module.ema is None:
            raise CheckpointError(f"ckpt={cfg.ckpt} has no EMA weights (trained without recipe.ema_decay)")
        module.net = module.ema.module
        module.ema = None

    batch_size = int(data_cfg.batch_size or hparams["plan"]["per_device_batch"])
    datamodule = ClassificationDataModule(data_cfg, batch_size=batch_size)
    if datamodule.classes != module.classes:
        raise CheckpointError(
            f"data.root={data_cfg.root} has {len(datamodule.classes)} classes that differ from the "
            f"checkpoint's {len(module.classes)}"
        )
    precision_cfg = train_cfg.precision
    if cfg.get("precision"):
        precision_cfg = OmegaConf.load(Path(__file__).parent / "conf" / "precision" / f"{cfg.precision}.yaml")
    precision, plugins = resolve_precision(precision_cfg, str(cfg.trainer.accelerator))
    report = ReportCallback(cfg.run_dir)
    trainer = L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        precision=precision,
        plugins=plugins,
        logger=False,
        callbacks=[report],
        use_distributed_sampler=False,
        enable_progress_bar=True,
    )
    results = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    metrics = {k: float(v) for k, v in results.items()}
    metrics.update(report.val.summary("val", trainer.world_size))
    output = Path(cfg.output) if cfg.get("output") else Path(cfg.run_dir) / "eval.json"
    write_json_atomic(output, {"ckpt": str(cfg.ckpt), **metrics})
    print(json.dumps(metrics, indent=2))
    return metrics
