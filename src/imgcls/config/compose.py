"""Config composition that every command shares: the conf/ folder, its group options, the resolvers, the
train config for a set of overrides, and the keys evaluate, classify, export and the inference benchmark
read alike (ckpt=, model=, precision=)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, overload

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from imgcls.config import schema
from imgcls.config.published import resolve as published
from imgcls.distributed import is_rank_zero
from imgcls.errors import ConfigError
from imgcls.typed_config import merge, to_dict

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def options(group: str) -> list[str]:
    """The choices of a config group (its YAML files; `_`-prefixed files are shared bases)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


def _choice(group: str, default: Any, *, _root_: DictConfig) -> Any:
    """The option chosen for a config group (Hydra's hydra.runtime.choices), or default where none is.

    Read from the config's own `hydra` node while it has one (composition, Hydra's run dir and log file),
    else from the running Hydra app's (the task function's config, which Hydra gives without that node).
    `${hydra:runtime.choices.X}` reads the app's only, which Hydra's compose API never sets: compose_config
    fixes the value while the node is at hand."""
    hydra_cfg = _root_.hydra if "hydra" in _root_ else HydraConfig.get()
    choice = hydra_cfg.runtime.choices.get(group)
    return default if choice is None else choice


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("imgcls.first"):
        # ${imgcls.first:a,b}: the first value that is not null (oc.select keeps an explicit null).
        OmegaConf.register_new_resolver(
            "imgcls.first", lambda *values: next((v for v in values if v is not None), None)
        )
    if not OmegaConf.has_resolver("imgcls.product"):
        # ${imgcls.product:a,b,c}: a x b x c, e.g. a TF experiment's global batch = per-GPU batch x GPUs x nodes
        # (TF1/TF2 have no accumulation and scale the LR by GPUs x batch themselves).
        OmegaConf.register_new_resolver("imgcls.product", lambda *values: math.prod(int(v) for v in values))
    if not OmegaConf.has_resolver("imgcls.choice"):
        # ${imgcls.choice:experiment,train}: the experiment's file name, or train without one (train.yaml task_name)
        OmegaConf.register_new_resolver("imgcls.choice", _choice)
    if not OmegaConf.has_resolver("imgcls.published"):
        # ${imgcls.published:NAME,expected|batch}: an experiment's row of NVIDIA's published runs (published.py)
        OmegaConf.register_new_resolver("imgcls.published", published)
    if not OmegaConf.has_resolver("imgcls.rank_zero"):
        # ${imgcls.rank_zero:A,B}: A in the launch's global rank 0, B in every other rank, read where the value is
        # used. conf/hydra/default.yaml: only rank 0 writes .hydra/ and the log, on every launcher; a submitit
        # task resolves it in its own process, where its SLURM_PROCID is (no command line of its own to add to).
        OmegaConf.register_new_resolver("imgcls.rank_zero", lambda zero, other: zero if is_rank_zero() else other)


register_resolvers()
schema.register()  # GROUP/_schema, the base every option of a group names first (config/schema.py)


def group_option(group: str, option: str) -> DictConfig:
    """conf/GROUP/OPTION.yaml as composition puts it into the group, without composing the rest: the entries of
    its defaults list merged in order, each the group's schema (`_schema`, config/schema.py), another option of
    the group (`_base`, hardware/auto's `cpu`, ...) or the file's own keys (`_self_`; last where the list leaves
    it out, as Hydra does). The file alone (OmegaConf.load) lacks every key its bases set. Interpolations into
    other groups are left unresolved; not struct, as the schema Hydra composes from (schema.base)."""
    path = CONF_DIR / group / f"{option}.yaml"
    content = OmegaConf.load(path)
    if not isinstance(content, DictConfig):
        raise TypeError(f"{path}: not a mapping")
    entries = list(content.pop("defaults", []))
    if "_self_" not in entries:
        entries.append("_self_")
    layers: list[DictConfig] = []
    for entry in entries:
        if entry == "_self_":
            layers.append(content)
        elif entry == "_schema" and group in schema.GROUPS:
            layers.append(schema.base(group))
        elif isinstance(entry, str) and "/" not in entry and ":" not in entry:
            layers.append(group_option(group, entry))
        else:  # another group's option, an override: composition's, which a group's own options do not use
            raise ValueError(f"{path}: defaults entry {entry!r} is not _schema, _self_ or an option of {group}")
    merged = merge(*layers)
    OmegaConf.set_struct(merged, False)
    return merged


def compose_config(config_name: str, overrides: list[str]) -> DictConfig:
    """conf/CONFIG_NAME.yaml with these overrides, as a Hydra run of it would see it: Hydra's compose()
    without its `hydra` node, task_name fixed from that node first (${imgcls.choice:...} needs it).
    Composes with the running Hydra app's config dir, else with CONF_DIR."""
    if not GlobalHydra.instance().is_initialized():
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose_config(config_name, overrides)
    cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        if "task_name" in cfg:
            cfg.task_name = cfg.task_name  # the resolved value replaces the interpolation
        del cfg["hydra"]
    return cfg


def compose_train(overrides: list[str]) -> DictConfig:
    """The train config for these overrides: its model, data and precision groups give the defaults of
    what a weights-only file does not say. Works inside a running Hydra app and outside one (tests)."""
    return compose_config("train", overrides)


@overload
def required_ckpt(cfg: DictConfig, needed: Literal[True] = ...) -> str: ...


@overload
def required_ckpt(cfg: DictConfig, needed: bool) -> str | None: ...


def required_ckpt(cfg: DictConfig, needed: bool = True) -> str | None:
    if OmegaConf.is_missing(cfg, "ckpt") or cfg.get("ckpt") in (None, ""):
        if needed:
            raise ConfigError("ckpt=PATH is required (a checkpoint of train.py or a file of imgcls.export)")
        return None
    return str(cfg.ckpt)


def precision_config(cfg: DictConfig, default: Any = None) -> Any:
    """precision=NAME of the command line, else the checkpoint's, else fp32."""
    if cfg.get("precision") is not None:
        return cfg.precision
    if default is not None:
        return OmegaConf.create(default)
    return group_option("precision", "fp32")


def model_config(cfg: DictConfig) -> dict[str, Any] | None:
    """`model=NAME` of the command line, resolved (its channels_last follows the precision)."""
    if cfg.get("model") is None:
        return None
    both = OmegaConf.create({"model": cfg.model, "precision": precision_config(cfg)})
    return to_dict(both.model, resolve=True)
