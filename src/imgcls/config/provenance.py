"""Which YAML file set a config key. The composed config keeps no file of its keys, so for a key config.checks
refuses, the files of the defaults list Hydra composed are read again (OmegaConf, read-only) to name the one the
user must edit: a shipped option, an experiment, conf/local/default.yaml or a user's option in a search path
(--config-dir, hydra.searchpath).

Only on the way to an error line: a config whose keys all pass never comes here, so composition costs nothing
more. The defaults list is Hydra's own (the running app's config loader, `compute_defaults_list`, with the run's
overrides), as are the config sources it is looked up in (`hydra.runtime.config_sources`, in Hydra's order).
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf


def where_set(keys: Sequence[str]) -> dict[str, list[str]]:
    """For each dotted key, where the running Hydra app's config got it: the YAML files that set it, in
    composition order (shown relative to the working directory when under it), else the command-line overrides
    that did. Empty outside a Hydra app, or where Hydra cannot say: the error line then names no source, and a
    failure here never hides the error it serves."""
    found: dict[str, list[str]] = {key: [] for key in keys}
    if not keys or not HydraConfig.initialized() or not GlobalHydra.instance().is_initialized():
        return found
    try:
        hydra_cfg = HydraConfig.get()
        overrides = [*hydra_cfg.overrides.hydra, *hydra_cfg.overrides.task]
        defaults = (
            GlobalHydra.instance()
            .config_loader()
            .compute_defaults_list(hydra_cfg.job.config_name, overrides, RunMode.RUN)
        )
        sources = list(hydra_cfg.runtime.config_sources)
        for config_path, package in _files(defaults.defaults):
            path = _locate(config_path, sources)
            content = OmegaConf.load(path) if path is not None else None
            if path is None or not isinstance(content, DictConfig):
                continue
            for key in keys:
                inner = _inside(key, package)
                if inner == "" or inner is not None and inner.split(".")[0] != "defaults" and _sets(content, inner):
                    found[key].append(_shown(path))
        for key in keys:
            if not found[key]:
                found[key] = [f"the command line ({o})" for o in hydra_cfg.overrides.task if _sets_on_line(o, key)]
    except Exception:  # noqa: BLE001 - only to name the file; the error line stands without it
        return {key: found.get(key, []) for key in keys}
    return found


def _files(defaults: Iterable[Any]) -> list[tuple[str, str]]:
    """(config path, package) of each config file of Hydra's defaults list (its ResultDefault entries), in order;
    Hydra's own (package hydra) left out: Hydra checks them."""
    files: list[tuple[str, str]] = []
    for default in defaults:
        package = default.package or ""
        if default.config_path is None or package == "hydra" or package.startswith("hydra."):
            continue
        if (default.config_path, package) not in files:
            files.append((default.config_path, package))
    return files


def _locate(config_path: str, sources: Iterable[Any]) -> Path | None:
    """The file of config_path in the first config source that has it (Hydra's search order)."""
    for source in sources:
        if source.schema == "file":
            candidate = Path(source.path) / f"{config_path}.yaml"
        elif source.schema == "pkg":
            root = importlib.resources.files(str(source.path).replace("/", "."))
            candidate = Path(str(root.joinpath(f"{config_path}.yaml")))
        else:  # structured configs (the ConfigStore) are no file
            continue
        if candidate.is_file():
            return candidate
    return None


def _inside(key: str, package: str) -> str | None:
    """key relative to a file's package (`recipe.ema_decay` in package recipe: `ema_decay`; the package itself:
    ""); None outside it."""
    if not package:
        return key
    if key == package:
        return ""
    return key[len(package) + 1 :] if key.startswith(package + ".") else None


def _sets(content: DictConfig, key: str) -> bool:
    """Whether the file's own content has the dotted key (nothing resolved: an interpolation is a value too)."""
    node: Any = content
    for part in key.split("."):
        if not isinstance(node, DictConfig) or node._is_none() or part not in node.keys():
            return False
        node = node._get_node(part)
    return True


def _sets_on_line(override: str, key: str) -> bool:
    name = override.split("=", 1)[0].lstrip("+~")
    return key == name or key.startswith(name + ".")


def _shown(path: Path) -> str:
    resolved = path.resolve()
    try:
        return str(resolved.relative_to(Path.cwd()))
    except ValueError:
        return str(resolved)
