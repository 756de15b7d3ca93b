"""Typed views of OmegaConf's loosely typed results: the one place where a config node becomes a plain dict, and
where a merge of mapping configs is known to give a mapping config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

from omegaconf import DictConfig, OmegaConf

T = TypeVar("T")


def to_dict(node: Any, *, resolve: bool = False) -> dict[str, Any]:
    """OmegaConf.to_container of a mapping node, typed as the dict it is.

    to_container is typed for every container (a dict, a list, a string of a structured config); a mapping node
    gives a dict, and anything else here is a programming error, raised as such."""
    container = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(container, dict):
        raise TypeError(f"expected a mapping config node, got {type(container).__name__}")
    # The keys of an imgcls config are strings (YAML mappings and dotted overrides); OmegaConf types them as any
    # of its key types.
    return cast(dict[str, Any], container)


def merge(*configs: Any) -> DictConfig:
    """OmegaConf.merge of mapping configs (DictConfigs and dicts), typed as the DictConfig it gives.

    merge is typed for lists too; merging mappings gives a mapping, and anything else here is a programming error."""
    merged = OmegaConf.merge(*configs)
    if not isinstance(merged, DictConfig):
        raise TypeError(f"expected mapping configs to merge, got {type(merged).__name__}")
    return merged


def settings(schema: type[T], values: Mapping[str, Any] | DictConfig) -> T:
    """A config group's settings from a mapping no composition made (a checkpoint's stored config, a weights file's
    model keys, a test's dict): merged onto the group's schema dataclass (config/schema.py), so that every key is
    there, with the given value or the schema's default, typed as the schema types it; the code then reads plain
    attributes, as it does of a composed config. A key the schema no longer has (an older imgcls's) is kept, unread;
    reading a key the schema lacks raises, as in a composed config."""
    base = OmegaConf.structured(schema)
    OmegaConf.set_struct(base, False)
    merged = merge(base, values)
    OmegaConf.set_struct(merged, True)
    # The merged DictConfig has every field of the dataclass (Hydra's pattern: code typed with the schema reads a
    # DictConfig made from it).
    return cast(T, merged)
