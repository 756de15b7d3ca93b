"""Weights files: read ours, timm's or torchvision's state_dicts; load a trained model with its metadata.

Three kinds of file hold a network:
- an imgcls training checkpoint (Lightning .ckpt: `state_dict` with `net.*` / `ema.module.*` keys,
  `hyper_parameters` with the model, classes and run config);
- an imgcls weights export (`python -m imgcls.export format=weights`, NVIDIA's checkpoint2model): a plain
  state_dict plus metadata (arch, model config, classes, preprocessing);
- a foreign state_dict (timm's or torchvision's files): keys only, the user names the model.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn

from imgcls.data.imagenet_classes import imagenet_names
from imgcls.errors import CheckpointError

# Prefixes that wrappers put in front of the network's own keys.
_PREFIXES = ("module.", "net.", "model.", "_orig_mod.")
EXPORT_FORMAT = "imgcls.weights/1"
# The data keys that make up the val preprocessing (what imgcls.data.transforms.val_transform reads).
PREPROCESSING_KEYS = ("image_size", "val_crop_pct", "interpolation", "mean", "std")


def read_torch_file(path: str | Path, key: str = "ckpt") -> Any:
    """torch.load on CPU with one-line errors naming the config key the path came from."""
    path = Path(str(path)).expanduser()
    if not path.is_file():
        raise CheckpointError(f"{key}={path} does not exist")
    try:
        return safe_torch_load(path)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        why = why_unreadable(exc)
        raise CheckpointError(f"{key}={path} is not a PyTorch checkpoint or weights file ({why})") from None


def safe_torch_load(path: str | Path, mmap: bool = False) -> Any:
    """torch.load that never runs code from the file. weights_only=True is enough for every file imgcls reads:
    its training checkpoints (Lightning resumes them the same way) and weights exports hold tensors and plain
    containers, as do timm's and torchvision's state_dicts; a file with other Python objects is refused."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def why_unreadable(exc: Exception) -> str:
    if isinstance(exc, pickle.UnpicklingError) and "weights only" in str(exc).lower():
        return "it holds Python objects besides tensors, which are not unpickled: that could run code"
    return type(exc).__name__


def is_training_checkpoint(blob: Any) -> bool:
    return isinstance(blob, dict) and "imgcls" in blob and "hyper_parameters" in blob and "state_dict" in blob


def is_weights_export(blob: Any) -> bool:
    return isinstance(blob, dict) and blob.get("format") == EXPORT_FORMAT


def state_dict_of(blob: Any, path: str | Path, key: str = "model.weights") -> dict[str, torch.Tensor]:
    if isinstance(blob, dict) and "state_dict" in blob:
        blob = blob["state_dict"]
    if not isinstance(blob, dict) or not blob or not all(isinstance(v, torch.Tensor) for v in blob.values()):
        raise CheckpointError(f"{key}={path} holds no state_dict")
    # A whole training checkpoint also fits: its EMA copy is dropped, `net.` is stripped.
    return {_strip(k): v for k, v in blob.items() if not _strip(k).startswith("ema.")}


def read_state_dict(path: str | Path, key: str = "model.weights") -> dict[str, torch.Tensor]:
    return state_dict_of(read_torch_file(path, key), path, key)


def _strip(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def head_name(net: nn.Module) -> str:
    return str(getattr(net, "pretrained_cfg", {}).get("classifier", "fc"))


def load_state(
    net: nn.Module, state: dict[str, torch.Tensor], source: str, arch: str, new_head_ok: bool = True
) -> None:
    """Load a state_dict whose keys are timm's (torchvision's ResNet/ResNeXt keys are the same, head `fc`
    in both, checked in tests/test_export.py). A head of another class count is dropped and stays freshly
    initialized when new_head_ok (fine-tuning); anything else that does not fit is one clear error."""
    state = dict(state)
    own = net.state_dict()
    head = head_name(net)
    mismatched_head = [k for k in state if k.startswith(head + ".") and k in own and state[k].shape != own[k].shape]
    if new_head_ok:
        for key in mismatched_head:
            del state[key]
    # timm's published files leave out BN's num_batches_tracked (unused in eval and by momentum BN).
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    missing = [k for k in missing if not (new_head_ok and k in mismatched_head)]
    unexpected = [k for k in state if k not in own]
    wrong = [
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in state
        if k in own and state[k].shape != own[k].shape
    ]
    if missing or unexpected or wrong:
        parts = [
            f"{len(items)} {what} (e.g. {items[:3]})"
            for items, what in ((missing, "missing"), (unexpected, "unexpected"), (wrong, "of another shape"))
            if items
        ]
        hint = " (torchvision's layout is only the same as timm's for ResNet/ResNeXt)" if unexpected else ""
        raise CheckpointError(f"{source} does not fit model {arch}: {', '.join(parts)}{hint}")
    net.load_state_dict(state, strict=False)


def load_weights(net: nn.Module, path: str | Path, arch: str) -> None:
    """`model.weights=PATH`: ours (export or checkpoint), timm's or torchvision's state_dict."""
    load_state(net, read_state_dict(path), f"model.weights={path}", arch)


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

    def metadata(self) -> dict[str, Any]:
        return {
            "format": EXPORT_FORMAT,
            "arch": self.arch,
            "model": self.model_cfg,
            "classes": self.classes,
            "image_size": int(self.preprocessing["image_size"]),
            "preprocessing": self.preprocessing,
            "ema": self.ema,
        }


def preprocessing_of(data_cfg: Any) -> dict[str, Any]:
    data = OmegaConf.to_container(data_cfg, resolve=True) if OmegaConf.is_config(data_cfg) else dict(data_cfg)
    return {k: data[k] for k in PREPROCESSING_KEYS}


def _build(model_cfg: dict[str, Any], num_classes: int) -> nn.Module:
    from imgcls.models.factory import build_network  # factory imports this module

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
        )
    if is_weights_export(blob):
        _check_arch(blob["arch"], model_cfg, path, key)
        if use_ema and not blob.get("ema"):
            raise CheckpointError(f"{key}={path} holds the raw weights; export with use_ema=true for the EMA ones")
        net = _build(blob["model"], len(blob["classes"]))
        load_state(net, blob["state_dict"], f"{key}={path}", blob["arch"], new_head_ok=False)
        return TrainedModel(
            net.eval(),
            blob["arch"],
            dict(blob["model"]),
            list(blob["classes"]),
            dict(blob["preprocessing"]),
            bool(blob.get("ema")),
            "weights",
        )
    state = state_dict_of(blob, path, key)
    if model_cfg is None:
        raise CheckpointError(f"{key}={path} is a plain state_dict without metadata: name its model (model=NAME)")
    if use_ema:
        raise CheckpointError(f"{key}={path} is a plain state_dict: use_ema needs an imgcls checkpoint")
    probe = _build(model_cfg, 1)
    head_key = head_name(probe) + ".weight"
    if classes is None:
        if head_key not in state:  # not this architecture: the full list of what does not fit
            load_state(probe, state, f"{key}={path}", model_cfg["arch"], new_head_ok=False)
        count = state[head_key].shape[0]
        # 1000 outputs: timm's and torchvision's ImageNet-1k files, labels in sorted-wnid order.
        classes = list(imagenet_names()) if count == 1000 else [str(i) for i in range(count)]
    net = _build(model_cfg, len(classes))
    load_state(net, state, f"{key}={path}", model_cfg["arch"], new_head_ok=False)
    return TrainedModel(
        net.eval(), model_cfg["arch"], dict(model_cfg), list(classes), dict(preprocessing or {}), False, "state_dict"
    )
