"""A typo'd key in a YAML file, tried as a user makes it: in conf/local/default.yaml (the file conf/train.yaml and
docs/distributed.md tell users to write), in a shipped option of each group or an experiment, in a user's own
option in a search path. Each ends before anything is built in one line naming the file, the key and the key
meant; exit 2. Was: the run went on with the setting the key meant at its default (no EMA, the profile's loader
workers), exit 0.

The processes compose a copy of conf/ (`--config-path COPY`): conf/local/ is the user's own, git-ignored folder,
and the tests must not write into the checkout's, which other processes compose."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from omegaconf import open_dict
from omegaconf.errors import ValidationError

from imgcls.config.checks import EVALUATE, TRAIN, check_config, unknown_keys
from imgcls.config.compose import compose_config as compose_typed
from imgcls.config.compose import options
from imgcls.errors import ConfigError
from tests.conftest import CONF, ROOT, assert_one_line_error, compose_config, run_clis

LOCAL = "# @package _global_\n"  # a site's settings for every group, as conf/local/default.yaml holds them

# One typo per config group, in a user's conf/local/default.yaml: (its YAML, the key, the key meant).
GROUP_TYPOS: dict[str, tuple[str, str, str]] = {
    "model": ("model:\n  drop_rat: 0.1\n", "model.drop_rat", "model.drop_rate"),
    "precision": ("precision:\n  loss_scale:\n    init_scal: 1024\n", "precision.loss_scale.init_scal",
                  "precision.loss_scale.init_scale"),
    "hardware": ("hardware:\n  pin_memroy: false\n", "hardware.pin_memroy", "hardware.pin_memory"),
    "recipe": ("recipe:\n  epochs: 7\n  ema_decy: 0.9999\n", "recipe.ema_decy", "recipe.ema_decay"),
    "data": ("data:\n  num_worker: 4\n", "data.num_worker", "data.num_workers"),
    "logger": ("logger:\n  tensorbord: {}\n", "logger.tensorbord", "logger.tensorboard"),
    "callbacks": ("callbacks:\n  early_stoping_patience: 3\n", "callbacks.early_stoping_patience",
                  "callbacks.early_stopping_patience"),
    "trainer": ("trainer:\n  max_epoch: 3\n", "trainer.max_epoch", "trainer.max_epochs"),
    "top level": ("sed: 7\n", "sed", "seed"),
}  # fmt: skip

# One typo per config group in a shipped option of the group that extends the group's schema (config/schema.py),
# edited in a copy: (the option's file, its line, the key, the key meant). recipe: the "shipped option" case below.
# The options python train.py chooses; hardware=auto's keys are cpu's (auto.yaml extends cpu.yaml).
OPTION_TYPOS: dict[str, tuple[str, str, str, str]] = {
    "model": ("model/resnet50.yaml", "drop_rat: 0.1\n", "model.drop_rat", "model.drop_rate"),
    "precision": ("precision/fp32.yaml", "tf3: true\n", "precision.tf3", "precision.tf32"),
    "hardware": ("hardware/cpu.yaml", "pin_memroy: false\n", "hardware.pin_memroy", "hardware.pin_memory"),
    "data": ("data/imagenet.yaml", "num_worker: 4\n", "data.num_worker", "data.num_workers"),
    "logger": ("logger/csv.yaml", "tensorbord: {}\n", "logger.tensorbord", "logger.tensorboard"),
    "callbacks": ("callbacks/default.yaml", "early_stoping_patience: 3\n", "callbacks.early_stoping_patience",
                  "callbacks.early_stopping_patience"),
    "trainer": ("trainer/default.yaml", "max_epoch: 3\n", "trainer.max_epoch", "trainer.max_epochs"),
}  # fmt: skip


# A value the group's schema field cannot hold, in a user's conf/local/default.yaml: (its YAML, the line's text).
# Was: Hydra's multi-line ValidationError (and a traceback from imgcls's own pre-check), exit 1.
VALUE_TYPOS: dict[str, tuple[str, str]] = {
    "data": ("data:\n  num_workers: abc\n", "data.num_workers=abc must be an integer >= 0"),
    "recipe": ("recipe:\n  nesterov: maybe\n", "recipe.nesterov=maybe must be true or false"),
    "precision": ("precision:\n  tf32: sometimes\n", "precision.tf32=sometimes must be true or false"),
}


def conf_copy(folder: Path, edits: dict[str, str]) -> Path:
    """A copy of conf/ with these files (relative path -> text appended; a new file where there is none)."""
    copy = folder / "conf"
    shutil.copytree(CONF, copy, ignore=shutil.ignore_patterns("local", "__pycache__"))
    for name, text in edits.items():
        path = copy / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as file:
            file.write(text)
    return copy


def train(folder: Path, *args: str) -> list[str]:
    """`python train.py ARGS` refused before anything is built: the dataset folder is not there."""
    return [str(ROOT / "train.py"), *args, f"data.root={folder / 'no-data'}", f"hydra.run.dir={folder / 'run'}"]


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every case as a real `python train.py` process, run at once: (the result, the file the line must name)."""
    cases: dict[str, tuple[list[str], Path]] = {}

    def in_a_copy(case: str, file: str, text: str, *args: str) -> None:
        folder = tmp_path_factory.mktemp(case.replace(" ", "_"))
        conf = conf_copy(folder, {file: text})
        cases[case] = train(folder, "--config-path", str(conf), *args), conf / file

    for group, (text, _, _) in GROUP_TYPOS.items():
        in_a_copy(group, "local/default.yaml", LOCAL + text)
    for group, (file, text, _, _) in OPTION_TYPOS.items():
        in_a_copy(f"{group} option", file, text)
    # A shipped option and an experiment, edited: the default recipe (90e), and one of NVIDIA's runs.
    in_a_copy("shipped option", "recipe/90e.yaml", "ema_decy: 0.9999\n")
    experiment = "resnet50_dgxa100_amp_90e"
    in_a_copy(
        "experiment", f"experiment/{experiment}.yaml", "recipe:\n  ema_decy: 0.9999\n", f"experiment={experiment}"
    )
    # conf/local/default.yaml without its package line: Hydra puts its keys under `local`, where nothing reads them.
    in_a_copy("no package", "local/default.yaml", "recipe:\n  epochs: 7\n")

    # A user's own config dir (--config-dir): an option of a shipped group, and a group of their own.
    mine = tmp_path_factory.mktemp("mine") / "conf"
    (mine / "recipe").mkdir(parents=True)
    (mine / "recipe" / "mine.yaml").write_text("defaults:\n  - _base\n  - _self_\nname: mine\nema_decy: 0.9999\n")
    cases["own option"] = train(mine.parent, "--config-dir", str(mine), "recipe=mine"), mine / "recipe" / "mine.yaml"
    (mine / "site").mkdir()
    (mine / "site" / "workers.yaml").write_text("# @package data\nnum_worker: 4\n")
    cases["own group"] = train(mine.parent, "--config-dir", str(mine), "+site=workers"), mine / "site" / "workers.yaml"

    # A value of the wrong type for its schema field (OmegaConf refuses it while Hydra composes the file).
    for group, (text, _) in VALUE_TYPOS.items():
        in_a_copy(f"{group} value", "local/default.yaml", LOCAL + text)
    (mine / "recipe" / "bad_value.yaml").write_text("defaults:\n  - _base\n  - _self_\nname: bad\nnesterov: maybe\n")
    cases["own option value"] = (
        train(mine.parent, "--config-dir", str(mine), "recipe=bad_value"),
        mine / "recipe" / "bad_value.yaml",
    )

    results = run_clis({case: args for case, (args, _) in cases.items()}, timeout=300)
    return {case: (result, cases[case][1]) for case, result in results.items()}


@pytest.mark.parametrize("group", list(GROUP_TYPOS))
def test_a_typo_in_the_users_local_file_is_refused_naming_the_file(refused: dict, group: str) -> None:
    result, file = refused[group]
    _, key, meant = GROUP_TYPOS[group]
    assert_one_line_error(result, f"{file}: {key} is not ", f"did you mean {meant}?")
    assert not (file.parents[2] / "no-data").exists()


@pytest.mark.parametrize(
    "case,key,meant",
    [
        *((f"{group} option", key, meant) for group, (_, _, key, meant) in OPTION_TYPOS.items()),
        ("shipped option", "recipe.ema_decy", "recipe.ema_decay"),
        ("experiment", "recipe.ema_decy", "recipe.ema_decay"),
        ("own option", "recipe.ema_decy", "recipe.ema_decay"),
        ("own group", "data.num_worker", "data.num_workers"),
    ],
)
def test_a_typo_in_a_shipped_or_own_option_is_refused_naming_it(refused: dict, case: str, key: str, meant: str) -> None:
    result, file = refused[case]
    assert_one_line_error(result, f"{file}: {key} is not ", f"did you mean {meant}?")


@pytest.mark.parametrize("group", list(VALUE_TYPOS))
def test_a_value_of_the_wrong_type_in_a_yaml_file_is_one_line_naming_it(refused: dict, group: str) -> None:
    result, file = refused[f"{group} value"]
    assert_one_line_error(result, f"{file}: {VALUE_TYPOS[group][1]}")


def test_a_value_of_the_wrong_type_in_an_own_option_is_one_line_naming_it(refused: dict) -> None:
    result, file = refused["own option value"]
    assert_one_line_error(result, f"{file}: recipe.nesterov=maybe must be true or false")


def test_a_local_file_without_its_package_line_is_refused_saying_so(refused: dict) -> None:
    result, file = refused["no package"]
    assert_one_line_error(result, f"{file}: local is not a config key", "`# @package _global_` to set recipe")


# --- the key check itself, in process ---------------------------------------------------------------------
def test_outside_a_hydra_app_the_line_names_the_key_and_the_key_meant() -> None:
    cfg = compose_config(["experiment=demo"])
    with open_dict(cfg):
        cfg.recipe.ema_decy = 0.9999
        cfg.data.num_worker = 4
    with pytest.raises(ConfigError) as refusal:
        check_config(cfg)
    assert str(refusal.value) == (
        "recipe.ema_decy is not a key of recipe; did you mean recipe.ema_decay? | "
        "data.num_worker is not a key of data; did you mean data.num_workers?"
    )


def test_a_trainer_argument_imgcls_sets_is_refused_with_the_key_to_set() -> None:
    cfg = compose_config([])
    with open_dict(cfg):
        cfg.trainer.precision = 16
    with pytest.raises(ConfigError, match=r"^trainer\.precision is set by imgcls; use precision="):
        check_config(cfg)


def test_values_a_consumer_reads_as_a_whole_are_no_keys_of_the_tables() -> None:
    """A free-form value (trainer.max_time's timedelta fields, fsspec's options, an experiment's result) and a
    logger switched on by its empty mapping pass; a key under a value that takes none does not."""
    cfg = compose_config(["logger=tensorboard"])
    with open_dict(cfg):
        cfg.trainer.max_time = {"days": 1, "hours": 2}
        cfg.data.storage_options = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
        cfg.expected = {"top1": 76.5, "hours": 3}
    assert unknown_keys(cfg, TRAIN) == []
    with open_dict(cfg):  # a value the schema types Any (Lightning's int or float): a mapping composes
        cfg.trainer.limit_train_batches = {"value": 3}
    assert unknown_keys(cfg, TRAIN) == ["trainer.limit_train_batches.value"]
    typed = compose_typed("train", [])  # Hydra's composition (tests.conftest's cached copies are untyped YAML)
    with pytest.raises(ValidationError):  # a group whose options extend their schema (config/schema.py): its type
        typed.recipe.epochs = {"value": 3}


def test_every_debug_and_search_option_and_the_evaluate_config_pass_the_key_check() -> None:
    """tests/test_config_checks.py checks every option of the other groups."""
    for group in ("debug", "hparams_search"):
        for option in options(group):
            assert unknown_keys(compose_config([f"{group}={option}"]), TRAIN) == [], option
    assert unknown_keys(compose_config([], "evaluate"), EVALUATE) == []
