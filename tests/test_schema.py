"""The typed schema of each config group (imgcls.config.schema): every field that holds a value names what it
allows (or why it is free-form), a value out of a field's range is refused in one line, and every shipped option of
every group is an instance of its group's schema (types as the fields declare them; no key the schema lacks)."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf, open_dict

from imgcls.config import checks, schema
from imgcls.config.checks import check_config
from imgcls.config.compose import compose_config, compose_train, options
from imgcls.config.overrides import check_command_line
from imgcls.config.ranges import anything
from imgcls.errors import ConfigError

# The fields with no `allowed` (config/ranges.py's anything), and why: a value checked where it is used (by
# timm, Lightning, a backend, a file system), or one no value of which is wrong. A field added without a range
# fails test_every_value_field_names_what_it_allows until it gets one or a line here.
FREE_FORM: dict[str, str] = {
    "task_name": "a name of the run dirs",
    "ckpt_path": "a path or `last`: run/train.py names a missing checkpoint",
    "run_dir": "a folder, Hydra's",
    "expected": "an experiment's published result, copied to report.json as is",
    "model.name": "a name, reported",
    "model.arch": "timm's architectures: models/factory.py names an unknown one",
    "model.batch_profile": "a row of hardware.batch: run/plan.py names a missing one",
    "model.weights": "a path: the loader names a missing or foreign file",
    "precision.name": "a name, reported",
    "precision.lightning": "Lightning's precision argument, checked by Lightning",
    "precision.loss_scale": "null or the block below, whose keys have ranges",
    "hardware.name": "a profile's name, replaced by hardware=auto's choice",
    "hardware.auto": "written by imgcls: why hardware=auto chose the profile",
    "recipe.name": "a name, reported",
    "recipe.interpolation": "data.interpolation's default: the backend names one it lacks",
    "recipe.randaugment": "a timm RandAugment string: data/augment.py parses it",
    "recipe.qat": "null or the block below, whose keys have ranges",
    "data.name": "a name, reported",
    "data.root": "a folder or URL: the dataset names a missing one",
    "data.label_base": "data/shards names what is allowed (auto, 0, 1)",
    "data.index_dir": "a folder: DALI's index files",
    "data.interpolation": "the backend names one it lacks (data/dali/pipelines.py, data/augment.py)",
    "data.randaugment": "a timm RandAugment string: data/augment.py parses it",
    "data.class_names": "data/shards/manifest.py names a bad list",
    "data.trace_dir": "a folder, or null",
    "logger.wandb": "null or the block below",
    "logger.wandb.project": "a W&B name",
    "logger.wandb.entity": "a W&B name",
    "logger.wandb.name": "a W&B name",
    "logger.wandb.tags": "W&B tags",
    "callbacks.checkpoint": "null (no checkpoints) or the block below",
    "trainer.max_time": "Lightning's: DD:HH:MM:SS or a mapping of timedelta fields",
    "trainer.gradient_clip_algorithm": "Lightning's, checked by Lightning",
    "trainer.fast_dev_run": "Lightning's: true or a number of batches",
    "trainer.benchmark": "Lightning's cudnn.benchmark: true, false or null",
    "trainer.profiler": "Lightning's, checked by Lightning",
    "trainer.model_registry": "Lightning's, checked by Lightning",
}


def _value_fields() -> dict[str, Any]:
    """Dotted key -> field of every schema key that holds a value (checks.schema_checks' keys)."""
    found: dict[str, Any] = {}
    for group, cls in schema.GROUPS.items():
        prefix = f"{group}." if group else ""
        fields = {prefix + key: f for key, f in schema.keys(cls).items()}
        found.update({key: fields[key] for key in checks.schema_checks(group)})
    return found


def test_every_value_field_names_what_it_allows() -> None:
    fields = _value_fields()
    unranged = {key for key, f in fields.items() if f.metadata["allowed"] is anything}
    assert sorted(unranged - set(FREE_FORM)) == [], "a field without `allowed` and no reason in FREE_FORM"
    assert sorted(set(FREE_FORM) - unranged) == [], "FREE_FORM names a key that has a range (or no such key)"
    for key, f in fields.items():
        if f.metadata["allowed"] is not anything:  # a check names what it allows for any value it refuses
            assert f.metadata["allowed"](object()), key


def test_the_train_tables_are_the_schemas_ranges() -> None:
    """checks.TRAIN holds each field's own check (no second table), plus the batch table's rows."""
    fields = _value_fields()
    assert {k: c for k, c in checks.TRAIN.items() if k not in checks.BATCH_ROWS} == {
        key: f.metadata["allowed"] for key, f in fields.items()
    }


# A few keys of each group, each with a value its range refuses: the one line naming key, value and what is allowed.
OUT_OF_RANGE = [
    (["seed=-1"], "seed=-1 must be an integer from 0 to 4294967295"),
    (["mode=eval"], "mode=eval must be one of train, benchmark, plan"),
    (["benchmark.iterations=0"], "benchmark.iterations=0 must be a positive integer"),
    (["model.drop_rate=1"], "model.drop_rate=1 must be a number in [0, 1)"),
    (["model.conv_init=xavier"], "model.conv_init=xavier must be one of fan_in, fan_out, classic, fanin, grp-fanin, "
     "grp-fanout, tf1, tf2"),
    (["model.bn_eps=0"], "model.bn_eps=0 must be a number > 0 or null"),
    (["precision=amp", "precision.loss_scale.backoff_factor=1"],
     "precision.loss_scale.backoff_factor=1 must be a number in (0, 1)"),
    (["precision=amp", "precision.loss_scale.growth_interval=0"],
     "precision.loss_scale.growth_interval=0 must be a positive integer"),
    (["hardware=cpu", "hardware.prefetch_factor=0"], "hardware.prefetch_factor=0 must be a positive integer or null"),
    (["hardware=dgxa100", "hardware.batch.resnet50.full.per_device=0"],
     "hardware.batch.resnet50.full.per_device=0 must be a positive integer"),
    (["recipe.optimizer=adam"], "recipe.optimizer=adam must be one of sgd, rmsprop, rmsprop_tf"),
    (["recipe.momentum=1"], "recipe.momentum=1 must be a number in [0, 1)"),
    # a list[float] field holds 60 as 60.0
    (["recipe.lr_milestones=[60,30]"], "recipe.lr_milestones=[60.0, 30.0] must be a list of numbers, each number "
     ">= 0, in increasing order"),
    (["data.hflip=2"], "data.hflip=2 must be a number in [0, 1]"),
    (["data.on_bad_image=ignore"], "data.on_bad_image=ignore must be one of skip, error"),
    (["data.progressive.start_epoch=-1"], "data.progressive.start_epoch=-1 must be an integer >= 0"),
    (["logger=wandb", "logger.wandb.log_images=-1"], "logger.wandb.log_images=-1 must be an integer >= 0"),
    (["callbacks.progress_bar=fancy"], "callbacks.progress_bar=fancy must be one of rich, tqdm, none or null"),
    (["callbacks.checkpoint.keep_epochs=-2"],
     "callbacks.checkpoint.keep_epochs=-2 must be an integer >= 0 (or -1) or null"),
    (["trainer.limit_train_batches=0"],
     "trainer.limit_train_batches=0 must be a number of batches >= 1, a fraction in (0, 1], or null"),
    (["trainer.barebones=true"], "trainer.barebones=true must be false (barebones drops the checkpoints and logs)"),
    (["trainer.num_nodes=0"], "trainer.num_nodes=0 must be a positive integer"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "line"), OUT_OF_RANGE, ids=[" ".join(o) for o, _ in OUT_OF_RANGE])
def test_a_value_out_of_its_fields_range_is_one_line(overrides: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_config(compose_config("train", overrides), warn=False)
    assert str(refused.value) == line


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
