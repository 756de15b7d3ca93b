"""A trained network from any weights file, with what is needed to use it: classes and val preprocessing.

The one loader that evaluate, classify, export and the inference benchmark share (models/weights.py reads
the files; models/factory.py builds the network).

A weights file is untrusted input: whoever hands one over chooses every value in it. So only what describes the
network is taken from it (the model keys, the val preprocessing, the class names, the training's precision name and
val batch size, the QAT recipe values that an export describes), each checked to be a plain value of its type, and
no string holding `${` is accepted anywhere: a stored config is never made into an OmegaConf config that would
resolve `${oc.env:...}` and the like. Where the data is, how it is read and cached, what to trace: none of that is
read from a file (a stored data.root of `pipe:CMD` is a shell command, `${oc.env:SECRET}` a secret sent to a URL);
it comes from the user's command line and config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from imgcls.config.checks import DATA, MODEL, PRECISION, RECIPE, Check, choice, integer
from imgcls.config.compose import group_option, options
from imgcls.config.schema import DataSchema, ModelSchema
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
from imgcls.typed_config import settings, to_dict

# The data keys that make up the val preprocessing (what imgcls.data.transforms.val_transform reads).
PREPROCESSING_KEYS = ("image_size", "val_crop_pct", "val_crop_padding", "interpolation", "mean", "std")
# Resize interpolations of timm's transforms (PIL) and of DALI (data/dali/pipelines.py INTERPOLATION).
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos", "triangular", "box", "hamming")
# What a stored val preprocessing value may be: the training config's rules, plus a closed set of interpolation
# names (config.checks leaves it to the library, but a stored string must not be free-form).
PREPROCESSING_CHECKS: dict[str, Check] = {
    **{k: DATA[f"data.{k}"] for k in PREPROCESSING_KEYS if k != "interpolation"},
    "interpolation": choice(*INTERPOLATIONS),
}
# The model keys a stored model config may give, with the training config's rules; other keys are dropped.
MODEL_CHECKS: dict[str, Check] = {k.removeprefix("model."): c for k, c in MODEL.items() if k != "model.weights"}
# Of a stored precision config: its name (one of conf/precision/) and these switches; the rest is the user's file.
PRECISION_SWITCHES = ("channels_last", "tf32", "cpu_fp16")
# Of a stored recipe: what qat.describe says of a QAT network in its exports.
RECIPE_CHECKS: dict[str, Check] = {
    "name": RECIPE["recipe.name"],
    "epochs": RECIPE["recipe.epochs"],
    **{k.removeprefix("recipe."): check for k, check in RECIPE.items() if k.startswith("recipe.qat.")},
}
BATCH_LIMIT = 1 << 20  # a stored batch size above this is not a batch size
NAME_LIMIT = 200  # characters of a stored name (arch, model name, class name)


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
    quantizers: dict[str, Any] | None = None  # recipe=qat: the fake quantizers' layout (quantization/qat.py)
    # Of a training checkpoint only, each checked (module docstring): the training's precision config (the user's
    # conf/precision/NAME.yaml with the run's switches), its val batch size, and its recipe's QAT values.
    precision: dict[str, Any] | None = None
    val_batch_size: int | None = None
    recipe: dict[str, Any] = field(default_factory=dict)

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
            meta["quantization"] = qat.describe({"recipe": self.recipe})
        return meta


def preprocessing_of(data_cfg: DataSchema) -> dict[str, Any]:
    """The val preprocessing of the user's own data config (a file's is read by checked_preprocessing)."""
    data = to_dict(data_cfg, resolve=True)
    return {k: data[k] for k in PREPROCESSING_KEYS}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse(source: str, key: str, value: Any, allowed: str) -> CheckpointError:
    return CheckpointError(f"{source} holds {key}={_shown(value)}, which is not allowed: it must be {allowed}")


def _mapping(value: Any, source: str, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise _refuse(source, key, value, "a mapping of names to values")
    return value


def _checked(value: Any, check: Check, source: str, key: str) -> Any:
    """value when `check` allows it, as a plain value (a list of numbers as a list); else one CheckpointError line.
    A string is refused when it holds `${` whatever the check says: read into an OmegaConf config it would be
    resolved (an environment variable read, a resolver run) where it is used."""
    if isinstance(value, str) and ("${" in value or len(value) > NAME_LIMIT or not value.isprintable()):
        plain = f"a plain string (no ${{...}} interpolation, no control characters, at most {NAME_LIMIT} characters)"
        raise _refuse(source, key, value, plain)
    allowed = check(value)
    if allowed is not None:
        raise _refuse(source, key, value, allowed)
    return list(value) if isinstance(value, (list, tuple)) else value


def _name(value: Any) -> str | None:
    """A check for the stored names that config.checks leaves free (`anything`): a string or null."""
    return None if value is None or isinstance(value, str) else "a string or null"


def checked_preprocessing(stored: Any, source: str, where: str = "preprocessing") -> dict[str, Any]:
    """The val preprocessing of a weights file (PREPROCESSING_KEYS), each value checked; `source` (`ckpt=PATH`)
    names the file in the error, `where` the mapping the file holds them in."""
    stored = _mapping(stored, source, where)
    # val_crop_padding: null where a file predates it; the other keys every imgcls file has.
    return {k: _checked(stored.get(k), PREPROCESSING_CHECKS[k], source, f"{where}.{k}") for k in PREPROCESSING_KEYS}


def checked_classes(stored: Any, source: str) -> list[str]:
    if not isinstance(stored, (list, tuple)) or not stored:
        raise _refuse(source, "classes", stored, "a list of class names")
    not_str = "a string (class names are plain strings)"
    return [_checked(name, lambda v: None if isinstance(v, str) else not_str, source, "classes") for name in stored]


def checked_model(stored: Any, source: str) -> dict[str, Any]:
    """The model keys of a weights file that build the network (MODEL_CHECKS), each checked; an architecture timm
    does not have is refused here (timm.create_model of a name like `hf-hub:...` would download it). The file's
    model.weights is never read: the weights are the file's own."""
    stored = _mapping(stored, source, "model")
    model: dict[str, Any] = {}
    for key, check in MODEL_CHECKS.items():
        if key in stored:
            rule = _name if check(object()) is None else check  # `anything` in the config's table: a name here
            model[key] = _checked(stored[key], rule, source, f"model.{key}")
    arch = model.get("arch")
    if not isinstance(arch, str) or not timm.is_model(arch):
        raise _refuse(source, "model.arch", arch, "an architecture of timm")
    return {**model, "weights": None}


def checked_precision(stored: Any, source: str) -> dict[str, Any] | None:
    """The training's precision: the user's conf/precision/NAME.yaml for the stored name (only the name and the
    PRECISION_SWITCHES booleans are taken from the file); None without one (a checkpoint without run config)."""
    if stored is None:
        return None
    stored = _mapping(stored, source, "precision")
    name = _checked(stored.get("name"), choice(*options("precision")), source, "precision.name")
    precision = to_dict(group_option("precision", name), resolve=True)
    for key in PRECISION_SWITCHES:
        if key in stored and key in precision:
            precision[key] = _checked(stored[key], PRECISION[f"precision.{key}"], source, f"precision.{key}")
    return precision


def checked_recipe(stored: Any, source: str) -> dict[str, Any]:
    """The recipe values an export of a QAT network describes (RECIPE_CHECKS), each checked."""
    if stored is None:
        return {}
    stored = _mapping(stored, source, "recipe")
    recipe: dict[str, Any] = {}
    for key, check in RECIPE_CHECKS.items():
        *parents, leaf = key.split(".")
        node: Any = stored
        for parent in parents:
            node = node.get(parent) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping) or node.get(leaf) is None:
            continue
        rule = _name if check(object()) is None else check
        value = _checked(node[leaf], rule, source, f"recipe.{key}")
        target = recipe
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = value
    return recipe


def _tensors(stored: Any, source: str) -> dict[str, torch.Tensor]:
    if not isinstance(stored, Mapping) or not all(isinstance(v, torch.Tensor) for v in stored.values()):
        raise CheckpointError(f"{source} holds a state_dict that is not a mapping of names to tensors")
    return {str(k): v for k, v in stored.items()}


def val_batch_size_of(hparams: Mapping[str, Any], source: str) -> int | None:
    """The val batch training ran (data.val_batch_size, else data.batch_size, else the plan's per-device batch),
    so that evaluation's numbers are the ones training logged; None where the file says none."""
    run_config = hparams.get("run_config")
    data = run_config.get("data") if isinstance(run_config, Mapping) else None
    plan = hparams.get("plan")
    candidates = [
        ("data.val_batch_size", data.get("val_batch_size") if isinstance(data, Mapping) else None),
        ("data.batch_size", data.get("batch_size") if isinstance(data, Mapping) else None),
        ("plan.per_device_batch", plan.get("per_device_batch") if isinstance(plan, Mapping) else None),
    ]
    for key, value in candidates:
        if value is not None:
            return int(_checked(value, integer(1, BATCH_LIMIT), source, key))
    return None


def _build(model_cfg: dict[str, Any], num_classes: int) -> nn.Module:
    # A file's model keys, or a model option's: what an older file lacks gets the schema's default.
    return build_network(settings(ModelSchema, {**model_cfg, "weights": None}), num_classes)


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
    source = f"{key}={path}"
    if is_training_checkpoint(blob):
        hparams = _mapping(blob["hyper_parameters"], source, "hyper_parameters")
        meta = _mapping(blob["imgcls"], source, "imgcls")
        model = checked_model(hparams.get("model"), source)
        _check_arch(model["arch"], model_cfg, path, key)
        prefix = "net."
        if use_ema:
            if meta.get("has_ema") is not True:
                raise CheckpointError(f"{key}={path} has no EMA weights (trained without recipe.ema_decay)")
            prefix = "ema.module."
        stored = _tensors(blob["state_dict"], source)
        state = {k[len(prefix) :]: v for k, v in stored.items() if k.startswith(prefix)}
        classes = checked_classes(hparams.get("classes"), source)
        run_config = hparams.get("run_config")
        run_config = _mapping(run_config, source, "run_config") if run_config is not None else {}
        preprocessing = checked_preprocessing(run_config.get("data"), source, "run_config.data")
        precision = checked_precision(run_config.get("precision"), source)
        val_batch_size = val_batch_size_of(hparams, source)
        recipe = checked_recipe(hparams.get("recipe", run_config.get("recipe")), source)
        net = _build(model, len(classes))
        quantizers = blob.get(qat.STATE_KEY)
        if quantizers is not None:  # recipe=qat: the quantizers first, their ranges come with the weights
            net = qat.restore(net, quantizers)
        load_state(net, state, source, model["arch"], new_head_ok=False)
        return TrainedModel(
            net.eval(),
            model["arch"],
            model,
            classes,
            preprocessing,
            use_ema,
            "checkpoint",
            quantizers,
            precision=precision,
            val_batch_size=val_batch_size,
            recipe=recipe,
        )
    if is_weights_export(blob):
        model = checked_model(blob.get("model"), source)
        _check_arch(model["arch"], model_cfg, path, key)
        if use_ema and blob.get("ema") is not True:
            raise CheckpointError(f"{key}={path} holds the raw weights; export with use_ema=true for the EMA ones")
        classes = checked_classes(blob.get("classes"), source)
        preprocessing = checked_preprocessing(blob.get("preprocessing"), source)
        net = _build(model, len(classes))
        quantizers = blob.get(qat.STATE_KEY)
        if quantizers is not None:  # a weights export of a QAT checkpoint
            net = qat.restore(net, quantizers)
        load_state(net, _tensors(blob["state_dict"], source), source, model["arch"], new_head_ok=False)
        return TrainedModel(
            net.eval(),
            model["arch"],
            model,
            classes,
            preprocessing,
            blob.get("ema") is True,
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
