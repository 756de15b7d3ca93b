"""Each config fact has one home: a value config.checks validates up front is not checked again where it is used.

Every `raise ConfigError` in src/imgcls outside config/checks.py is listed below with why it cannot live in the
table: the check depends on the installed libraries, this machine, the data or files on disk, or it checks a
command's own arguments that no table covers. A new raise site fails here until it is classified; a site that
re-checks a key the table already checks fails too (unless it is on LEFT, the re-checks still to delete).
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from imgcls.cli import EVALUATE_MODES, TRAIN_MODES
from imgcls.config import schema as group_schema
from imgcls.config.checks import EVALUATE, OPEN, SCHEMAS, TRAIN, anything, check_config, rule_for
from imgcls.config.compose import compose_config as compose_typed
from imgcls.config.compose import options
from imgcls.config.overrides import check_command_line
from imgcls.config.reference import reference
from imgcls.errors import ConfigError
from imgcls.training.module import MODEL_DEFAULTS, RECIPE_DEFAULTS
from tests.conftest import compose_config

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "imgcls"
SCHEMA = "config/checks.py"

# Why each site checks at run time. The tag before the colon says what the check needs that composition does not
# have: library (what is installed), machine (GPUs, cores, the launcher), data (files, the dataset, a checkpoint,
# the built network), command (a command's own arguments, outside the TRAIN/EVALUATE tables), consumer (a key the
# table leaves to the one module that reads it: `anything` there). A re-check or a cross-key rule of composed values
# has no tag: it belongs in config/checks.py.
ALLOWED: dict[str, str] = {
    "bench/data.py::parse_args": "command: python -m imgcls.bench.data's own key=value arguments",
    "bench/data.py::class_folders": "data: the class folders under data.root",
    "bench/data.py::link_dataset": "data: the JPEG files under data.root",
    "bench/inference.py::_run_onnx": "data: ckpt is an ONNX file, whose graph fixes what model= would set",
    "bench/inference.py::check_batch_sizes": "consumer: batch_sizes (EVALUATE leaves the list to bench/inference)",
    "bench/startup.py::build_tree": "data: the benchmark's folder on disk",
    "bench/startup.py::parse_args": "command: the startup benchmark's own arguments",
    "bench/training.py::run": "data: the loader ran out before the timed iterations",
    "classify/__init__.py::classify": "command: classify's batch_size (conf/classify.yaml has no table)",
    "classify/__init__.py::image_paths": "command: classify's images",
    "classify/__init__.py::load_predictor": "command: classify's backend, and model= against an ONNX ckpt (data)",
    "config/compose.py::required_ckpt": "consumer: ckpt is `???` until a command needs it (config.checks.leaves)",
    "data/augment.py::parse_randaugment": "consumer: data.randaugment, timm's RandAugment string",
    "data/backends.py::_dali.build": "library: NVIDIA DALI does not import",
    "data/dali/backend.py::DaliBackend.__init__": "machine: dali_gpu without a CUDA GPU",
    "data/dali/pipelines.py::interp_type": "library: the interpolations DALI has",
    "data/shards/__main__.py::main": "command: python -m imgcls.data.shards's subcommand",
    "data/shards/cache.py::parse": "command: `shards cache`'s arguments",
    "data/shards/cache.py::parse_size": "command: --max-size",
    "data/shards/cache.py::_days": "command: --older-than",
    "data/shards/cache.py::check_dir": "data: the folder is a shard cache imgcls wrote",
    "data/shards/cache.py::prune": "data: the folder is a shard cache imgcls wrote",
    "data/shards/convert.py::parse": "command: `shards convert`'s arguments",
    "data/shards/convert.py::_integer": "command: `shards convert`'s integer arguments",
    "data/shards/convert.py::convert": "command: convert()'s format and shard_size (Python API and command)",
    "data/shards/formats.py::check_format": "command: the shard format of convert/cache arguments",
    "data/shards/manifest.py::open_shard_set": "data: the manifest's classes; consumer: data.label_base",
    "data/shards/manifest.py::_classes_without_manifest": "data: shards without manifest.json",
    "data/shards/manifest.py::_count": "data: remote shards need data.shard_cache to be counted",
    "data/shards/remote.py::local_copy": "data: remote shards need data.shard_cache",
    "data/shards/remote.py::_filesystem": "library: fsspec refuses data.storage_options",
    "run/evaluate.py::evaluate_onnx": "data: ckpt is an ONNX file",
    "export/__init__.py::run": "command: export's format and output (a file on disk)",
    "export/triton.py::options": "command: format=triton's own keys; library: tritonclient",
    "export/triton.py::model_dir_of": "data: the checkpoint's arch as a folder name",
    "export/triton.py::_refuse_non_empty": "data: the Triton model folder on disk",
    "export/triton.py::build_engine": "library: trtexec failed",
    "export/triton.py::check_repository": "data: the written Triton repository",
    "models/factory.py::build_network": "library: model.arch is a timm architecture",
    "models/squeeze_excitation.py::se_kwargs": "library: which timm archs have SE blocks (model.arch)",
    "cli.py::refuse_flags": "command: a `--flag value` of the command line, answered with its KEY=VALUE",
    "config/overrides.py::check_command_line": "command: the command line's overrides",
    "config/overrides.py::parse": "command: the command line's overrides",
    "config/overrides.py::check_group_choices": "command: the command line's group choices",
    "config/overrides.py::_check_groups": "command: the command line's groups",
    "config/overrides.py::_check_yaml_values_of_own_dirs": "command: a YAML value Hydra composes before any check",
    "config/hardware.py::refuse_auto_on_a_cluster_launcher": "command: a SLURM sweep sized before auto resolves",
    "config/hardware.py::launch_of": "machine: the layout torchrun or srun gave this process",
    "bench/training.py::BenchmarkTimer.on_train_start": "data: an epoch shorter than the benchmark's timed window",
    "config/hardware.py::_fit_launch": "machine: torchrun/srun processes per node and nodes vs GPUs and trainer.*",
    "run/plan.py::accumulation_steps": "machine: the batches over the resolved world size (trainer.devices=auto)",
    "run/plan.py::lookup_batch": "machine: hardware=auto becomes the machine's profile after the checks run",
    "run/plan.py::world_size_of": "machine: the devices this machine has",
    "run/evaluate.py::run": "machine: the devices this machine has (plan.machine_refusal), as training's",
    "config/published.py::run_of": "data: published_runs.csv has the experiment's row",
    "config/published.py::resolve": "command: the resolver's field argument in a config file",
    "quantization/calibration.py::calibration_dataset": "data: calibration reads a folder dataset",
    "quantization/calibration.py::calibration_batches": "command: ptq's calibration.* keys (no table)",
    "quantization/placement.py::add_quantizers": "data: NVIDIA's quantizers need EfficientNet blocks in the network",
    "export/int8.py::options": "command: ptq's calibration.* keys (no table)",
    "quantization/qat.py::_modelopt": "library: NVIDIA Model Optimizer does not import",
    "run/rundir.py::launch_id": "machine: torchrun's rendezvous without a shared run dir",
    "run/rundir.py::check_run_files_are_ours": "data: the run dir holds files imgcls did not write",
    "run/trainer.py::check_trainer_args": "library: lightning.Trainer's arguments",
    "run/trainer.py::build_trainer": "machine: sync_batchnorm without GPUs",
}
TAGS = ("library", "machine", "data", "command", "consumer")
# What may check a key that the table checks too: what the table cannot know, or a re-check not yet deleted.
MAY_NAME_A_CHECKED_KEY = ("library", "machine", "data")


def _raise_sites() -> dict[str, list[str]]:
    """`path::Class.function` -> the messages (their leading text) of its `raise ConfigError(...)`s."""
    sites: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        if name != SCHEMA:
            _collect(ast.parse(path.read_text()), name, [], sites)
    return sites


def _collect(node: ast.AST, name: str, scope: list[str], sites: dict[str, list[str]]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            _collect(child, name, [*scope, child.name], sites)
            continue
        if isinstance(child, ast.Raise) and isinstance(child.exc, ast.Call):
            func = child.exc.func
            if getattr(func, "id", getattr(func, "attr", None)) == "ConfigError":
                site = f"{name}::{'.'.join(scope) or '<module>'}"
                sites.setdefault(site, []).append(_leading_text(child.exc))
        _collect(child, name, scope, sites)


def _leading_text(call: ast.Call) -> str:
    """The literal start of the message, up to its first {placeholder}."""
    arg = call.args[0] if call.args else None
    while isinstance(arg, ast.BinOp):  # "a" + f"b"
        arg = arg.left
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        text = ""
        for part in arg.values:
            if not isinstance(part, ast.Constant):
                break
            text += str(part.value)
        return text
    return ""


def _checked_key(message: str) -> str | None:
    """The `KEY=` a message starts with, where TRAIN or EVALUATE checks KEY's values (not `anything`)."""
    match = re.match(r"([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)+|mode|seed)=", message)
    if match is None:
        return None
    key = match.group(1)
    rules = [rule_for(key, table) for table in (TRAIN, EVALUATE)]
    return key if any(rule not in (None, anything) for rule in rules) else None


def test_every_config_error_raise_site_says_why_it_is_not_in_the_schema() -> None:
    sites = _raise_sites()
    unlisted = sorted(set(sites) - set(ALLOWED))
    assert not unlisted, f"raise ConfigError outside {SCHEMA}: put the check in its table, or list why here: {unlisted}"
    gone = sorted(set(ALLOWED) - set(sites))
    assert not gone, f"no `raise ConfigError` there any more: delete these entries: {gone}"
    untagged = {site: why for site, why in ALLOWED.items() if why.split(":")[0] not in TAGS}
    assert not untagged, untagged


def test_no_runtime_recheck_of_a_key_the_schema_validates() -> None:
    """A message `KEY=... must be ...` where config.checks already checks KEY: the same check twice."""
    rechecks = {
        site: keys
        for site, messages in _raise_sites().items()
        if (keys := sorted({k for m in messages if (k := _checked_key(m))}))
        and ALLOWED.get(site, "").split(":")[0] not in MAY_NAME_A_CHECKED_KEY
    }
    assert not rechecks, f"checked in {SCHEMA} already; trust the validated config: {rechecks}"


@pytest.mark.parametrize(("table", "modes"), [(TRAIN, TRAIN_MODES), (EVALUATE, EVALUATE_MODES)])
def test_the_modes_a_table_allows_are_the_modes_the_command_runs(table: dict, modes: dict) -> None:
    """cli.run_mode trusts the checked mode: the table's choice and the command's dispatch name the same modes."""
    allowed = {m for m in ("train", "benchmark", "plan", "evaluate", "bogus") if table["mode"](m) is None}
    assert allowed == set(modes)


@pytest.mark.parametrize("group", ["model", "recipe"])
def test_every_option_of_a_group_starts_from_its_schema(group: str) -> None:
    """config/schema.py's dataclass is the one home of a group's defaults (module.py's defaults for a checkpoint
    written before a key existed): every option of the group extends it, so it has each of its keys."""
    defaults = {"model": MODEL_DEFAULTS, "recipe": RECIPE_DEFAULTS}[group]
    assert defaults == group_schema.defaults(group) and defaults
    for option in options(group):
        # Hydra's composition itself: tests.conftest's cached copies are YAML read back, without their types.
        composed = compose_typed("train", [f"{group}={option}"])[group]
        extends = OmegaConf.get_type(composed) is group_schema.GROUPS[group]
        assert extends, f"{group}={option} does not extend its schema"
        assert set(defaults) <= set(composed), f"{group}={option} lacks {sorted(set(defaults) - set(composed))}"


def test_docs_config_keys_is_the_reference_the_schema_generates() -> None:
    """docs/config-keys.md is made from config.checks' tables and conf/ (`python -m imgcls.config.reference`)."""
    written = (ROOT / "docs" / "config-keys.md").read_text()
    assert written == reference(), "docs/config-keys.md is stale: run `python -m imgcls.config.reference`"


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"## {title}\n")
    return text[start : text.index("\n## ", start + 3)]


def _is_schema_key(key: str) -> bool:
    """A key of the TRAIN table (or one it names a node of: data.progressive, recipe.qat.*)."""
    return any(
        fnmatch.fnmatch(key, pattern) or fnmatch.fnmatch(pattern, key) or pattern.startswith(key + ".")
        for pattern in (*TRAIN, *OPEN)
    )


def test_every_key_the_readme_config_groups_section_names_is_a_schema_key() -> None:
    """The README names keys two ways: `group.key` anywhere in the section, and bare `key`s in the bullet of each
    group (outside parentheses, where values and explanations go). Each is a key of the schema."""
    section = _readme_section("Config groups")
    groups = ("model", "precision", "hardware", "recipe", "data", "logger", "callbacks", "trainer")
    dotted = [m.split("=")[0] for m in re.findall(r"`([a-z_]+\.[\w.*]+[^`]*)`", section) if m.split(".")[0] in groups]
    named = [re.match(r"[\w.*]+", key)[0] for key in dotted]  # `data.root/train`: the key data.root
    bullets = re.findall(r"^- \*\*([\w ]+)\*\*: (.*?)(?=^- \*\*|\n\n)", section, re.S | re.M)
    assert [g for g, _ in bullets] == ["model", "recipe", "data", "top level"], "the key list's groups changed"
    for group, text in bullets:
        while re.search(r"\([^()]*\)", text):
            text = re.sub(r"\([^()]*\)", "", text)  # values and explanations
        prefix = "" if group == "top level" else group + "."
        named += [prefix + key for key in re.findall(r"`([a-z_][\w.]*)`", text)]
    unknown = sorted({key for key in named if not _is_schema_key(key)})
    assert not unknown, f"README.md's Config groups names keys config.checks does not have: {unknown}"
    assert len(named) > 80  # the parse found the key lists


def test_each_group_schema_holds_its_own_group_keys() -> None:
    """One schema per config group: MODEL has model.* only, ...; TOP has train.yaml's own keys, none of a group's."""
    for group, schema in SCHEMAS.items():
        if group:
            assert all(key.startswith(group + ".") for key in schema), group
        else:
            assert not any(key.split(".")[0] in SCHEMAS for key in schema)
    assert TRAIN == {key: check for schema in SCHEMAS.values() for key, check in schema.items()}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # Ranges the schema checks, which the DALI settings and the AutoAugment policy no longer check again.
        (["data.dali_resize_threads=-1"], "^data.dali_resize_threads=-1 must be an integer >= 0$"),
        (["data.dali_host_prefetch=true"], "^data.dali_host_prefetch=true must be an integer >= 0$"),
        (["data.autoaugment_policy=v9"], "^data.autoaugment_policy=v9 must be one of v0, v0r, original, originalr$"),
        (["data.progressive.multiple_of=0"], "^data.progressive.multiple_of=0 must be a positive integer$"),
        # data.progressive's cross-key rules, moved from data/progressive.py into check_config.
        (["data.progressive.start_size=512"], "start_size=512 must be a positive size no larger than end_size=224"),
        (["data.progressive.stages=91"], "stages=91 must be between 1 and the epochs \\(90\\)"),
        (["data.progressive.start_epoch=5", "data.progressive.end_epoch=5"], "end_epoch=5 must be after start_epoch=5"),
        (["data.progressive.start_magnitude=2"], "start_magnitude ramps RandAugment, but data.augment=null"),
        (["data.on_bad_image=ignore"], "^data.on_bad_image=ignore must be one of skip, error$"),
        (["data.dali_train_resize=opencv"], "^data.dali_train_resize=opencv must be one of auto, torch, dali$"),
        (["recipe.augment=mixup"], "^recipe.augment=mixup must be one of autoaugment, randaugment or null$"),
        (["data.augment=cutout"], "^data.augment=cutout must be one of autoaugment, randaugment or null$"),
        # data/dali/host_resize.py's rules: DALI's policies run after DALI's resize; torch has three interpolations.
        (
            ["data.backend=dali_cpu", "data.dali_train_resize=torch", "recipe.augment=autoaugment"],
            "^data.dali_train_resize=torch cannot run data.augment=autoaugment",
        ),
        (
            ["data.backend=dali_cpu", "data.dali_train_resize=torch", "recipe.interpolation=lanczos"],
            "^data.dali_train_resize=torch has no lanczos resize; use data.interpolation=bilinear",
        ),
        # run/plan.py's accumulation no longer re-checks the batches: a zero or negative one stops here.
        (["data.batch_size=0"], "^data.batch_size=0 must be"),
        (["recipe.global_batch_size=-8"], "^recipe.global_batch_size=-8 must be"),
        # callbacks/order.py's rule, a cross-key one: early stopping watches val.top1.
        (
            ["callbacks.early_stopping_patience=3", "trainer.limit_val_batches=0"],
            "^callbacks.early_stopping_patience=3 needs validation",
        ),
        # callbacks/console.py no longer refuses a bar at run time (mode=plan let a typo through); Lightning's barebones
        # refused imgcls's own callbacks and loggers in a traceback.
        (["callbacks.progress_bar=rcih"], "^callbacks.progress_bar=rcih must be one of rich, tqdm, none or null$"),
        (["trainer.barebones=true"], "^trainer.barebones=true must be false"),
        # data/synthetic.py's rule: no folder to count the classes in.
        (["data=folder", "data.backend=synthetic"], "^data.num_classes must be set for the synthetic backend"),
    ],
)
def test_the_schema_refuses_what_runtime_code_no_longer_checks(overrides: list[str], message: str) -> None:
    args = ["hardware=cpu", "data.progressive.enabled=true", *overrides]
    with pytest.raises(ConfigError, match=message):
        # As the commands check: the command line first (a value the schema's type refuses stops there, before
        # Hydra's merge of it would fail with a traceback), then the composed config's cross-key rules.
        check_command_line("train", args, TRAIN)
        check_config(compose_config(args))


def test_a_progressive_schedule_the_schema_allows_passes() -> None:
    check_config(compose_config(["hardware=cpu", "data.progressive.enabled=true", "data.progressive.end_epoch=80"]))


# The data keys whose default (config/schema.py DataSchema) is another group's value: the data module reads one
# node, and the group that chooses the value (the machine, the network, the recipe) is another. Renaming either
# side would break documented command lines (data.backend=, data.num_workers=, model.image_size=, recipe.augment=
# ...); this list keeps the set from growing unnoticed. docs/config-keys.md shows each as its interpolation,
# naming where the value comes from.
MIRRORS = {
    "backend": "hardware.data_backend",
    "num_workers": "hardware.num_workers",
    "prefetch_factor": "hardware.prefetch_factor",
    "pin_memory": "hardware.pin_memory",
    "image_size": "model.image_size",
    "channels_last": "model.channels_last",
    "train_crop": "recipe.train_crop",
    "train_crop_object_boxes": "recipe.train_crop_object_boxes",
    "interpolation": "recipe.interpolation",
    "augment": "recipe.augment",
    "autoaugment_policy": "recipe.autoaugment_policy",
    "autoaugment_ops": "recipe.autoaugment_ops",
    "randaugment": "recipe.randaugment",
    "progressive.enabled": "recipe.stagewise",
    "progressive.start_size": "recipe.base_image_size",
    "progressive.stages": "recipe.stages",
    "progressive.total_epochs": "recipe.epochs",
    "progressive.start_magnitude": "recipe.base_randaug_magnitude",
}


def test_the_data_keys_that_mirror_another_group_are_the_listed_ones() -> None:
    found = {}
    for key, f in group_schema.keys(group_schema.DataSchema).items():
        match = re.match(r"\$\{(?:oc\.select:)?((?:hardware|model|recipe)\.\w+)", str(f.default))
        if match:
            found[key] = match.group(1)
    assert found == MIRRORS
    for key, source in MIRRORS.items():  # both names allow the same values (the data side may add null)
        mine, theirs = rule_for(f"data.{key}", TRAIN), rule_for(source, TRAIN)
        assert mine is not None and theirs is not None, key
        if anything not in (mine, theirs):
            assert mine(object()).removesuffix(" or null") == theirs(object()).removesuffix(" or null"), key
