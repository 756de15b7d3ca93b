"""A trained network from any weights file, with what is needed to use it: classes and val preprocessing.

The one loader that evaluate, classify, export and the inference benchmark share (models/weights.py reads
the files; models/factory.py builds the network).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from torch import nn

from imgcls.data.imagenet_classes import imagenet_names
from imgcls.errors import CheckpointError
from imgcls.models.factory import build_network, se_width_of
from imgcls.models.weights import (
    EXPORT_FORMAT,
    head_name,
    in_network_layout,
    is_training_checkpoint,
    is_weights_export,
    load_state,
    read_torch_file,
    state_dict_of,
)
from imgcls.quantization import qat
from imgcls.typed_config import to_dict

# The data keys that make up the val preprocessing (what imgcls.data.transforms.val_transform reads).
PREPROCESSING_KEYS = ("image_size", "val_crop_pct", "val_crop_padding", "interpolation", "mean", "std")


@dataclass
class TrainedModel:
    """A network in eval mode plus what is needed to use it: classes and the val preprocessing."""

    net: nn.Module
    arch: str
    model_cfg: dict[str, Any]
    classes: list[str]
    preprocessing: dict[str, Any]
    ema: bool = False
    kind: str = "checkpoint"  # checkpoint | weights | state_dict
    run_config: dict[str, Any] = field(default_factory=dict)
    quantizers: dict[str, Any] | None = None  # recipe=qat: the fake quantizers' layout (quantization/qat.py)

    def metadata(self) -> dict[str, Any]:
        meta = {
            "format": EXPORT_FORMAT,
            "arch": self.arch,
            "model": self.model_cfg,
            "classes": self.classes,
            "image_size": int(self.preprocessing["image_size"]),
            "preprocessing": self.preprocessing,
            "ema": self.ema,
        }
        if self.quantizers is not None:  # what an export of a QAT network says of itself (as format=int8's does)
            meta["quantization"] = qat.describe(self.run_config)
        return meta


def preprocessing_of(data_cfg: Any) -> dict[str, Any]:
    data = to_dict(data_cfg, resolve=True) if OmegaConf.is_config(data_cfg) else dict(data_cfg)
    return {k: data.get(k) for k in PREPROCESSING_KEYS}  # get: checkpoints older than val_crop_padding lack it


def _build(model_cfg: dict[str, Any], num_classes: int) -> nn.Module:
    return build_network(OmegaConf.create({**model_cfg, "weights": None}), num_classes)


def _check_arch(found: str, wanted: dict[str, Any] | None, path: str | Path, key: str) -> None:
    if wanted is not None and wanted.get("arch") != found:
        raise CheckpointError(
            f"{key}={path} holds a {found} network, not model={wanted.get('name')} ({wanted.get('arch')})"
        )


def load_trained(
    path: str | Path,
    use_ema: bool = False,
    model_cfg: dict[str, Any] | None = None,
    classes: list[str] | None = None,
    preprocessing: dict[str, Any] | None = None,
    key: str = "ckpt",
    blob: Any = None,
) -> TrainedModel:
    """Any of the three kinds of file -> TrainedModel. model_cfg/classes/preprocessing are needed only for
    a foreign state_dict (classes default to ImageNet's for a 1000-way head); for ours model_cfg must agree.
    blob: the file's content when the caller has already read it."""
    blob = read_torch_file(path, key) if blob is None else blob
    if is_training_checkpoint(blob):
        hparams, meta = blob["hyper_parameters"], blob["imgcls"]
        _check_arch(meta["arch"], model_cfg, path, key)
        prefix = "net."
        if use_ema:
            if not meta.get("has_ema"):
                raise CheckpointError(f"{key}={path} has no EMA weights (trained without recipe.ema_decay)")
            prefix = "ema.module."
        state = {k[len(prefix) :]: v for k, v in blob["state_dict"].items() if k.startswith(prefix)}
        model = dict(hparams["model"])
        net = _build(model, len(hparams["classes"]))
        quantizers = blob.get(qat.STATE_KEY)
        if quantizers is not None:  # recipe=qat: the quantizers first, their ranges come with the weights
            net = qat.restore(net, quantizers)
        load_state(net, state, f"{key}={path}", meta["arch"], new_head_ok=False)
        prep = preprocessing_of(hparams["run_config"]["data"])
        return TrainedModel(
            net.eval(),
            meta["arch"],
            model,
            list(hparams["classes"]),
            prep,
            use_ema,
            "checkpoint",
            hparams["run_config"],
            quantizers,
        )
    if is_weights_export(blob):
        _check_arch(blob["arch"], model_cfg, path, key)
        if use_ema and not blob.get("ema"):
            raise CheckpointError(f"{key}={path} holds the raw weights; export with use_ema=true for the EMA ones")
        net = _build(blob["model"], len(blob["classes"]))
        quantizers = blob.get(qat.STATE_KEY)
        if quantizers is not None:  # a weights export of a QAT checkpoint
            net = qat.restore(net, quantizers)
        load_state(net, blob["state_dict"], f"{key}={path}", blob["arch"], new_head_ok=False)
        return TrainedModel(
            net.eval(),
            blob["arch"],
            dict(blob["model"]),
            list(blob["classes"]),
            dict(blob["preprocessing"]),
            bool(blob.get("ema")),
            "weights",
            quantizers=quantizers,
        )
    state = state_dict_of(blob, path, key)
    if model_cfg is None:
        raise CheckpointError(f"{key}={path} is a plain state_dict without metadata: name its model (model=NAME)")
    if use_ema:
        raise CheckpointError(f"{key}={path} is a plain state_dict: use_ema needs an imgcls checkpoint")
    if model_cfg.get("se_width") is None:  # NVIDIA's SE-ResNeXt files: the SE width from the file's shapes
        model_cfg = {**model_cfg, "se_width": se_width_of(str(model_cfg["arch"]), state, f"{key}={path}")}
    probe = _build(model_cfg, 1)
    head_key = head_name(probe) + ".weight"
    if classes is None:
        _, renamed = in_network_layout(probe, state)  # NVIDIA's key layouts as timm's (nvidia_weights.py)
        if head_key not in renamed:  # not this architecture: the full list of what does not fit
            load_state(probe, state, f"{key}={path}", model_cfg["arch"], new_head_ok=False)
        count = renamed[head_key].shape[0]
        # 1000 outputs: timm's and torchvision's ImageNet-1k files, labels in sorted-wnid order.
        classes = list(imagenet_names()) if count == 1000 else [str(i) for i in range(count)]
    net = _build(model_cfg, len(classes))
    load_state(net, state, f"{key}={path}", model_cfg["arch"], new_head_ok=False)
    return TrainedModel(
        net.eval(), model_cfg["arch"], dict(model_cfg), list(classes), dict(preprocessing or {}), False, "state_dict"
    )
