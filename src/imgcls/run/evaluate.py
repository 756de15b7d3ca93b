"""`imgcls.run.evaluate.run(cfg)`: validate a checkpoint on the val split and write NVIDIA-named metrics.

`ckpt=` may be an imgcls training checkpoint (it says which model, classes, preprocessing and precision
to use), an imgcls weights export (same metadata), a foreign state_dict given `model=NAME` (timm's or
torchvision's keys), or an ONNX export of imgcls.export, fp32 or INT8, run on ONNX Runtime's CPU provider
(`evaluate_onnx`: the same metric names).
(`evaluate.py mode=benchmark` runs imgcls.bench.inference instead: see cli.py.)

The data to evaluate on is the user's for every kind of file: `data.root=` (required) and the other data keys of
the command line over the train config's data defaults (data=folder), as train.py composes them. A file gives the
network and its val preprocessing only (inference/trained.py says why): a checkpoint's stored data.root,
format, cache or trace folder is someone else's choice, and a `pipe:` root is a shell command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, cast

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from imgcls.callbacks.report import ReportCallback
from imgcls.config.checks import EVALUATE, check_config
from imgcls.config.compose import compose_train, model_config, precision_config, required_ckpt
from imgcls.config.schema import DataSchema
from imgcls.data.datamodule import ClassificationDataModule
from imgcls.errors import CheckpointError, ConfigError, DataError
from imgcls.inference.onnx_model import is_onnx_path, load_onnx
from imgcls.inference.trained import PREPROCESSING_KEYS, TrainedModel, load_trained
from imgcls.models.weights import is_training_checkpoint, is_weights_export, read_torch_file, state_dict_of
from imgcls.redaction import redact_url
from imgcls.run.hook_dispatch import dispatch_cheaply
from imgcls.run.plan import machine_refusal
from imgcls.storage import write_json_atomic
from imgcls.training.module import ClassificationModule
from imgcls.training.precision import resolve_precision
from imgcls.typed_config import merge, to_dict


def data_overrides(cfg: DictConfig) -> dict[str, Any]:
    return {k: v for k, v in to_dict(cfg.data).items() if v is not None}


def _data_settings(data_cfg: DictConfig) -> DataSchema:
    """DATA_CFG typed as the data settings it is: the train config's composed data group (data=folder), resolved,
    with the file's preprocessing and the command line's data keys merged on, has every key of DataSchema (Hydra's
    pattern: code typed with the schema reads a DictConfig made from it)."""
    return cast(DataSchema, data_cfg)


def val_data(data_cfg: DictConfig, batch_size: int, classes: list[str], ckpt: str) -> ClassificationDataModule:
    """The data of data_cfg, refused in one line when its classes are not the model's."""
    count = data_cfg.get("num_classes")
    if data_cfg.get("class_names") is None and (count is None or int(count) == len(classes)):
        # Shards without manifest.json (NVIDIA's TFRecords from build_imagenet_data.py) carry label numbers only: the
        # checkpoint names them, in its label order. A manifest's names win and are compared below.
        data_cfg = merge(data_cfg, {"class_names": list(classes)})
    datamodule = ClassificationDataModule(_data_settings(data_cfg), batch_size=batch_size)
    if datamodule.classes != classes:
        raise DataError(
            f"data.root={data_cfg.root} has {len(datamodule.classes)} classes that differ from the "
            f"{len(classes)} of ckpt={ckpt} (e.g. {datamodule.classes[:3]} vs {classes[:3]})"
        )
    return datamodule


def user_data(cfg: DictConfig, ckpt: str) -> tuple[DictConfig, dict[str, Any]]:
    """(data, recipe) of the user's train config (data=folder) at the command line's data.root, resolved in
    the config's own context; one line without data.root: a checkpoint says which network, not which data."""
    root = cfg.data.get("root")
    if not root:
        raise DataError(f"data.root=PATH is required to evaluate ckpt={ckpt} (a folder or shards with a val split)")
    train_cfg = compose_train(["data=folder"])
    train_cfg.data.root = str(root)
    return OmegaConf.create(to_dict(train_cfg.data, resolve=True)), to_dict(train_cfg.recipe, resolve=True)


def run(cfg: DictConfig) -> dict[str, Any]:
    check_config(cfg, EVALUATE)  # every value, once, before a checkpoint is read
    if (refusal := machine_refusal(cfg.trainer)) is not None:
        raise ConfigError(refusal)
    ckpt = required_ckpt(cfg)
    if is_onnx_path(ckpt):
        return evaluate_onnx(cfg, ckpt)
    blob = read_torch_file(ckpt, "ckpt")
    if is_training_checkpoint(blob):
        trained = load_trained(ckpt, bool(cfg.use_ema), model_cfg=model_config(cfg), blob=blob)
        precision = precision_config(cfg, trained.precision)
        data_cfg, recipe = user_data(cfg, ckpt)
        # DALI writes the memory format the network runs in, as training's data.channels_last (the model's) did.
        network = {"channels_last": bool(trained.model_cfg.get("channels_last", False))}
        data_cfg = merge(data_cfg, trained.preprocessing, network, data_overrides(cfg))
        # The val batch of training, so that the numbers are the ones training logged.
        batch_size = int(data_cfg.batch_size or trained.val_batch_size or 64)
    else:
        trained, data_cfg, recipe = _weights_only(cfg, ckpt, blob)
        precision = precision_config(cfg)
        batch_size = int(data_cfg.batch_size or 64)

    datamodule = val_data(data_cfg, batch_size, trained.classes, ckpt)
    module = _module_for(trained, recipe)
    precision_name, plugins = resolve_precision(precision, str(cfg.trainer.accelerator))
    report = ReportCallback(cfg.run_dir)
    trainer = L.Trainer(
        accelerator=cfg.trainer.accelerator,
        devices=cfg.trainer.devices,
        precision=precision_name,
        plugins=plugins,
        logger=False,
        callbacks=[report],
        use_distributed_sampler=False,
        enable_progress_bar=bool(cfg.trainer.get("enable_progress_bar", True)),
        enable_model_summary=False,
    )
    dispatch_cheaply(trainer)
    results = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    metrics = {k: float(v) for k, v in results.items()}
    metrics.update(report.val.summary("val", trainer.world_size))
    document = {
        "ckpt": ckpt,
        "model": trained.arch,
        "weights": "ema" if trained.ema else "raw",
        "precision": str(precision.name),
        "data.root": redact_url(str(data_cfg.root)),  # printed and written: no userinfo or signed query
        **metrics,
    }
    output = Path(cfg.output) if cfg.get("output") else Path(cfg.run_dir) / "eval.json"
    write_json_atomic(output, document)
    print(json.dumps(document, indent=2))
    said_where(output)
    return metrics


def evaluate_onnx(cfg: DictConfig, ckpt: str) -> dict[str, Any]:
    """An ONNX export (fp32 or INT8) on the val split of data.root, on ONNX Runtime: the metrics of a
    checkpoint evaluation (val.top1 / val.top5 in percent, val.loss = plain cross-entropy, val.total_ips /
    val.compute_ips), computed with the torchmetrics classes the LightningModule validates with."""
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassAccuracy

    from imgcls.training.timing import StepTimer

    for key in ("model", "precision"):
        if cfg.get(key) is not None:
            raise ConfigError(f"{key}= does not apply to an ONNX file (ckpt={ckpt}): it runs the graph it holds")
    if cfg.get("use_ema"):
        raise ConfigError(f"use_ema=true does not apply to an ONNX file; export with use_ema=true instead ({ckpt})")
    root = cfg.data.get("root")
    if not root:
        raise DataError(f"data.root=PATH is required to evaluate the ONNX file ckpt={ckpt} (it holds no data config)")
    model = load_onnx(ckpt)
    data_cfg = merge(compose_train(["data=folder"]).data, model.preprocessing, data_overrides(cfg))
    batch_size = int(data_cfg.batch_size or 64)
    datamodule = val_data(data_cfg, batch_size, model.classes, ckpt)
    classes = len(model.classes)
    top1 = MulticlassAccuracy(classes, top_k=1, average="micro")
    top5 = MulticlassAccuracy(classes, top_k=min(5, classes), average="micro")
    loss = MeanMetric()
    timer = StepTimer()
    cpu = torch.device("cpu")
    for batch in datamodule.val_dataloader():
        images, labels = datamodule.on_after_batch_transfer(batch, 0)  # uint8 from the workers: normalized here
        timer.batch_started(cpu)
        logits = torch.from_numpy(model(images))
        timer.batch_ended(len(labels), cpu)
        top1.update(logits, labels)
        top5.update(logits, labels)
        loss.update(torch.nn.functional.cross_entropy(logits, labels), weight=len(labels))
    if timer.samples == 0:
        raise DataError(f"data.root={root} has no readable val images")
    metrics = {
        "val.top1": float(top1.compute()) * 100,
        "val.top5": float(top5.compute()) * 100,
        "val.loss": float(loss.compute()),
        **timer.summary("val", 1),
    }
    document: dict[str, Any] = {
        "ckpt": ckpt,
        "model": model.arch,
        "weights": "ema" if model.metadata.get("ema") else "raw",
        "precision": model.precision,
        "backend": "onnxruntime",
        "data.root": redact_url(str(root)),
        **metrics,
    }
    if model.quantization:
        document["quantization"] = model.quantization
    output = Path(cfg.output) if cfg.get("output") else Path(cfg.run_dir) / "eval.json"
    write_json_atomic(output, document)
    print(json.dumps(document, indent=2))
    said_where(output)
    return metrics


def said_where(output: Path) -> None:
    """The metrics' file named on stderr, so that stdout stays the JSON document a script reads."""
    print(f"imgcls: wrote {output}", file=sys.stderr)


def _weights_only(cfg: DictConfig, ckpt: str, blob: Any) -> tuple[TrainedModel, DictConfig, dict[str, Any]]:
    """A weights export (metadata inside) or a foreign state_dict (model=NAME): the data config comes
    from the train config's folder dataset, with the file's own preprocessing when it has one."""
    if not is_weights_export(blob):  # what is wrong with the file is said before what is wrong with the data
        state_dict_of(blob, ckpt, "ckpt")
        if cfg.get("model") is None:
            raise CheckpointError(f"ckpt={ckpt} is a plain state_dict without metadata: name its model (model=NAME)")
    overrides = ["data=folder"]
    if cfg.get("model") is not None:
        overrides.append(f"model={cfg.model.name}")
    if cfg.get("precision") is not None:
        overrides.append(f"precision={cfg.precision.name}")
    train_cfg = compose_train(overrides)
    root = cfg.data.get("root")
    if not root:
        raise DataError(f"data.root=PATH is required to evaluate the weights-only file ckpt={ckpt}")
    train_cfg.data.root = str(root)
    data_cfg = OmegaConf.create(to_dict(train_cfg.data, resolve=True))
    model_cfg = model_config(cfg)
    if model_cfg is not None:
        data_cfg.image_size = int(model_cfg["image_size"])
    trained = load_trained(
        ckpt,
        bool(cfg.use_ema),
        model_cfg=model_cfg,
        classes=ClassificationDataModule(_data_settings(merge(data_cfg, data_overrides(cfg))), batch_size=1).classes,
        preprocessing={k: data_cfg.get(k) for k in PREPROCESSING_KEYS},
        blob=blob,
    )
    data_cfg = merge(data_cfg, trained.preprocessing, data_overrides(cfg))
    recipe = to_dict(train_cfg.recipe, resolve=True)
    return trained, data_cfg, recipe


def _module_for(trained: TrainedModel, recipe: dict[str, Any]) -> ClassificationModule:
    """The LightningModule gives validation_step and the torchmetrics of training, so the numbers are the
    ones training logged; its network is the loaded one (raw or EMA), so no val_ema pass."""
    module = ClassificationModule(
        model={**trained.model_cfg, "weights": None},
        recipe={**recipe, "ema_decay": None, "mixup": 0.0, "cutmix": 0.0},
        plan={},
        classes=trained.classes,
    )
    net = trained.net
    if module.channels_last:
        net = net.to(memory_format=torch.channels_last)
    module.net = net
    return module
