"""imgcls.typed_config: OmegaConf's results as the types the code relies on, and a wrong kind of node refused."""

from __future__ import annotations

import pytest
from omegaconf import DictConfig, OmegaConf

from imgcls.typed_config import merge, to_dict


def test_to_dict_gives_plain_nested_dicts_resolved_on_request() -> None:
    cfg = OmegaConf.create({"lr": 0.1, "recipe": {"base": "${lr}", "milestones": [30, 60]}})
    resolved = to_dict(cfg.recipe, resolve=True) | {"top": to_dict(cfg, resolve=True)}
    assert resolved["base"] == 0.1
    assert type(resolved["top"]["recipe"]) is dict and type(resolved["milestones"]) is list
    assert to_dict(cfg.recipe)["base"] == "${lr}"  # unresolved by default, as to_container


def test_to_dict_refuses_a_list_node() -> None:
    with pytest.raises(TypeError, match="expected a mapping config node, got list"):
        to_dict(OmegaConf.create([1, 2]))


def test_merge_of_mappings_is_a_dictconfig_later_values_winning() -> None:
    merged = merge(OmegaConf.create({"root": None, "size": 224}), {"root": "/data"})
    assert isinstance(merged, DictConfig) and merged.root == "/data" and merged.size == 224


def test_merge_refuses_lists() -> None:
    with pytest.raises(TypeError, match="expected mapping configs to merge, got ListConfig"):
        merge(OmegaConf.create([1]), [2])
