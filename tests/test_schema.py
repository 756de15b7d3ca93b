"""The typed schema of each config group (imgcls.config.schema) against config/checks.py's tables and conf/: the
two name the same keys (a key added to one and not the other fails here), and every shipped option of every group
is an instance of its group's schema (types as the fields declare them; no key the schema lacks)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf, open_dict

from imgcls.config import checks, schema
from imgcls.config.compose import compose_train, options
from imgcls.config.overrides import check_command_line
from imgcls.errors import ConfigError


def _table_keys(group: str) -> set[str]:
    prefix = f"{group}." if group else ""
    table = {**checks.SCHEMAS[group], **(checks.SWITCHES if group == "logger" else {})}
    if group == "data":
        table = {**table, "data.storage_options": checks.anything}  # OPEN's namespace, a field of the schema
    if group == "hardware":
        table = {**table, "hardware.batch": checks.anything}  # the table's rows are `*` patterns below it
    found = {k.removeprefix(prefix) for k in table if "*" not in k}
    return {k for k in found if not any(other.startswith(k + ".") for other in found)}  # leaves only


def _schema_leaves(group: str) -> set[str]:
    found = schema.keys(schema.GROUPS[group])
    return {k for k in found if not any(other.startswith(k + ".") for other in found)}


@pytest.mark.parametrize("group", list(schema.GROUPS))
def test_schema_and_checks_name_the_same_keys(group: str) -> None:
    fields = _schema_leaves(group)
    table = _table_keys(group)
    assert fields - table == set(), f"in schema.py, not in checks.py's table: {sorted(fields - table)}"
    assert table - fields == set(), f"in checks.py's table, not in schema.py: {sorted(table - fields)}"


def test_every_field_says_what_it_means() -> None:
    for group, cls in schema.GROUPS.items():
        for key, f in schema.keys(cls).items():
            assert set(f.metadata) >= {"meaning", "source"}, f"{group}.{key}"


GROUP_OPTIONS = [(g, o) for g in schema.GROUPS if g and g != "trainer" for o in options(g)] + [("trainer", "default")]


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_every_option_is_an_instance_of_its_schema(group: str, option: str) -> None:
    cfg = compose_train([f"{group}={option}"])
    node = cfg[group] if group else cfg
    own_missing = OmegaConf.missing_keys(node)
    typed = OmegaConf.merge(OmegaConf.structured(schema.GROUPS[group]), node)  # refuses an unknown key or a bad type
    with open_dict(cfg):
        cfg[group] = typed  # its interpolations resolve against the rest of the config
    # Every key the schema requires is set by the option (a `???` the option writes itself is the user's to fill).
    assert OmegaConf.missing_keys(cfg[group]) <= own_missing
    resolved = OmegaConf.to_container(cfg[group], resolve=True)
    assert isinstance(resolved, dict) and set(resolved) >= set(node)


def test_top_level_keys_are_an_instance_of_its_schema() -> None:
    cfg = compose_train([])
    own = OmegaConf.masked_copy(cfg, list(schema.keys(schema.TrainSchema)))
    OmegaConf.merge(OmegaConf.structured(schema.TrainSchema), own)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        # a value the schema's type refuses: the one line a value out of range gets
        (["recipe.epochs=abc"], "recipe.epochs=abc must be a positive integer"),
        (["model.image_size=1.5"], "model.image_size=1.5 must be a positive integer"),
        (["recipe.lr_milestones=[a]"], "recipe.lr_milestones=[a] must be a list of numbers"),
        # a key the schema lacks, in a group whose options extend it (not struct): the did-you-mean
        (["recipe.ema_decy=0.9"], "recipe.ema_decy is not a key of recipe; did you mean recipe.ema_decay=0.9?"),
        (["model.archx=x"], "model.archx is not a key of model; did you mean model.arch=x?"),
    ],
)
def test_a_bad_override_of_a_schema_group_is_one_line(args: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_command_line("train", args, checks.TRAIN)
    assert line in str(refused.value) and "\n" not in str(refused.value)


def test_an_option_only_key_is_added_with_a_plus_where_the_option_leaves_it_null() -> None:
    check_command_line("train", ["model=resnet50", "+model.se_width=16"], checks.TRAIN)  # no error
    assert compose_train(["model=resnet50", "+model.se_width=16"]).model.se_width == 16
