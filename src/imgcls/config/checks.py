"""Every value of the resolved config checked once, up front, against one schema per config group (MODEL, RECIPE,
DATA, ...: key -> allowed values).

Types, defaults and ranges are config/schema.py's: one dataclass per config group in Hydra's ConfigStore (its
"Structured Configs" schema pattern), which the group options extend (`defaults: [_schema, _self_]`), so OmegaConf
refuses a wrong type there; each field's metadata names what it allows (a check of config/ranges.py), and the tables
here are made from the fields (schema_checks), so a key and its range cannot be in one place and not the other. Here
are what the fields cannot say: the rows of the hardware batch table, the keys whose presence is the setting,
the mappings a user fills, the cross-key rules, and the tables of evaluate, classify and export.
tests/test_config_checks.py composes every group option and fails when a key is missing from them, so a new key
cannot slip past unchecked. docs/config-keys.md is generated from the schema and conf/ (imgcls.config.reference).
Runtime code trusts what is checked here: tests/test_config_home.py lists every other `raise ConfigError` and why
it cannot be checked up front. The tables are also what a `+KEY=...` on the command line
may add (imgcls.config.overrides refuses any other key, with a did-you-mean): a key of another group option
(+model.se_width=16, refused with its reason where the network has no SE), one inside a `*` pattern (expected,
hardware.batch) or one of OPEN's namespaces (data.storage_options: fsspec's options).

A bad value ends the run before anything is built, in one line naming the key, the value and what is
allowed (ConfigError, exit 2). So does a key no table has, wherever it was written (a typo in a shipped option, an
experiment, conf/local/default.yaml or a user's own option in a search path would otherwise leave the setting it
meant at its default, silently): one line naming the file that sets it (imgcls.config.provenance), the key and
the nearest key, as the command line's did-you-mean names it. Strings whose allowed values depend on the
installed libraries (model arch, backend, ...) are checked where they are used; here they only need to
be present.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from imgcls.config import schema
from imgcls.config.choices import EXPORT_FORMATS, HOST_RESIZE_MODES, IMGCLS_TRAINER_ARGS
from imgcls.config.compose import CONF_DIR, group_option
from imgcls.config.provenance import where_set
from imgcls.config.ranges import (
    COUNT,
    POSITIVE,
    POSITIVE_OR_NULL,
    Check,
    anything,
    boolean,
    choice,
    folder,
    integer,
    number,
    or_null,
)
from imgcls.errors import ConfigError

log = logging.getLogger(__name__)


# The checks of each group of `python train.py`, from config/schema.py: a key's range is its field's `allowed`
# (config/ranges.py), beside its type and default. TOP holds train.yaml's own keys.
def schema_checks(group: str) -> dict[str, Check]:
    """Dotted key -> check of every key of a group's schema that holds a value: a leaf, or a block that may be null
    (precision.loss_scale: null or the GradScaler settings below it). A block that cannot be null is no value, nor
    is a mapping-typed field: a namespace whose keys are BATCH_ROWS', OPEN's or SWITCHES'."""
    prefix = f"{group}." if group else ""
    found = schema.keys(schema.GROUPS[group])
    table: dict[str, Check] = {}
    for key, f in found.items():
        kind = str(f.type)
        block = any(other.startswith(key + ".") for other in found)
        if not kind.startswith("dict[") and (not block or kind.endswith("| None")):
            table[prefix + key] = f.metadata["allowed"]
    return table


# The rows of hardware.batch (a mapping in the schema: profile -> memory class -> row), fnmatch patterns where `*`
# is one or more name parts.
BATCH_ROWS: dict[str, Check] = {
    "hardware.batch.*.per_device": POSITIVE,
    "hardware.batch.*.global": POSITIVE,
    "hardware.batch.*.weight_decay": number(0, null=True),
}
TOP = schema_checks("")
MODEL = schema_checks("model")
PRECISION = schema_checks("precision")
HARDWARE = {**schema_checks("hardware"), **BATCH_ROWS}
RECIPE = schema_checks("recipe")
DATA = schema_checks("data")
LOGGER = schema_checks("logger")
CALLBACKS = schema_checks("callbacks")
TRAINER = schema_checks("trainer")  # closed: every lightning.Trainer argument imgcls does not set
TRAIN: dict[str, Check] = {**TOP, **MODEL, **PRECISION, **HARDWARE, **RECIPE, **DATA, **LOGGER, **CALLBACKS, **TRAINER}
# The schema of each group of `python train.py` ("": train.yaml's own keys).
SCHEMAS: dict[str, dict[str, Check]] = {
    "": TOP, "model": MODEL, "precision": PRECISION, "hardware": HARDWARE, "recipe": RECIPE, "data": DATA,
    "logger": LOGGER, "callbacks": CALLBACKS, "trainer": TRAINER,
}  # fmt: skip


# Mappings no shipped config fills that a user fills with `+KEY=...` (imgcls.config.overrides lets these through too).
OPEN: dict[str, Check] = {
    "data.storage_options.*": anything,  # fsspec's options for remote shards (docs/shards.md), checked by fsspec
    # An experiment's result is one ${imgcls.published:...} value; a user may fill the default's null by hand.
    "expected.*": anything,
}
# Keys whose presence is the setting: an empty mapping that turns a logger on (run/loggers.py reads the names).
# leaves() yields no empty mapping, so no value rule of LOGGER could match them; the key check knows them from here.
SWITCHES: dict[str, Check] = {"logger.csv": anything, "logger.tensorboard": anything}
# lightning.Trainer arguments imgcls sets from other keys: the key to set instead (None: nothing to set).
SET_BY_IMGCLS: dict[str, str | None] = {f"trainer.{key}": instead for key, instead in IMGCLS_TRAINER_ARGS.items()}

# The other commands: their model and precision keys are the schema's, as for training; their own keys (from
# evaluate.yaml, classify.yaml, export.yaml) have no dataclass yet, so their ranges are rows here.
# `python evaluate.py`: its own keys; model and precision (optional groups) as for training.
EVALUATE: dict[str, Check] = {
    **MODEL,
    **PRECISION,
    "task_name": anything,
    "mode": choice("evaluate", "benchmark"),
    "ckpt": anything,
    "use_ema": boolean,
    "output": anything,
    "data.root": anything,
    "data.backend": anything,
    "data.batch_size": POSITIVE_OR_NULL,
    "data.num_workers": integer(0, null=True),
    "data.val_crop_padding": integer(0, null=True),  # NVIDIA's eval resize for NGC files
    # null: the checkpoint's value (shard datasets: docs/shards.md)
    "data.format": or_null(TRAIN["data.format"]),
    "data.label_base": anything,  # data/shards names what is allowed (auto, 0, 1)
    "data.num_classes": POSITIVE_OR_NULL,
    "data.class_names": anything,  # data/shards/manifest.py names a bad list
    "data.index_dir": anything,
    "data.shard_cache": or_null(folder),  # null: the checkpoint's, else the default
    "data.storage_options": anything,  # a mapping of fsspec's options, checked by fsspec
    "data.storage_options.*": anything,
    "batch_sizes": anything,  # bench/inference.py names the bad item
    "benchmark.warmup": COUNT,
    "benchmark.iterations": POSITIVE,
    "benchmark.max_seconds": number(0, open_low=True, null=True),
    "benchmark.image_size": POSITIVE_OR_NULL,
    "trainer.accelerator": anything,
    "trainer.devices": anything,
    "trainer.enable_progress_bar": boolean,
    "run_dir": anything,
}

# `python -m imgcls.classify`: its own keys (conf/classify.yaml); model (for a plain state_dict) as for training.
CLASSIFY: dict[str, Check] = {
    **MODEL,
    "task_name": anything,
    "ckpt": anything,
    "images": anything,  # classify names a missing file or a folder without images
    "backend": choice("auto", "torch", "onnx"),
    "use_ema": boolean,
    "batch_size": POSITIVE,
    "topk": POSITIVE,  # more than the model's classes: all of them, as timm's inference.py does
    "json": boolean,
}
# `python -m imgcls.export`: its own keys (conf/export.yaml); model (for a foreign state_dict) as for training.
EXPORT: dict[str, Check] = {
    **MODEL,
    "task_name": anything,
    "ckpt": anything,
    "format": choice(*EXPORT_FORMATS),
    "use_ema": boolean,
    "output": anything,
    "opset": POSITIVE,
    # format=int8 and format=triton check their own keys (export/int8.py, export/triton.py options)
    "calibration.*": anything,
    "data.*": anything,
    "repo": anything,
    "name": anything,
    "max_batch": anything,
    "trt_precision": anything,
    "tensorrt": anything,
}


def leaves(cfg: DictConfig, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, resolved value) of every leaf; a list is one leaf; an empty mapping is none."""
    for key in cfg.keys():
        dotted = prefix + str(key)
        node = cfg._get_node(key)
        if isinstance(node, DictConfig) and not node._is_none():
            yield from leaves(node, dotted + ".")
        elif not OmegaConf.is_missing(cfg, key):  # `???` is reported by whoever needs the value ("must be set")
            try:
                value = cfg[key]  # resolved
            except InterpolationResolutionError:  # resolved by its consumer in another context (evaluate's model)
                continue
            yield dotted, value


def rule_for(key: str, table: dict[str, Check]) -> Check | None:
    if key in table:
        return table[key]
    return next((check for pattern, check in table.items() if "*" in pattern and fnmatch.fnmatch(key, pattern)), None)


def known(key: str, table: dict[str, Check] | None) -> bool:
    """A key of the check table, or inside one of its open namespaces (`*`, OPEN), or a mapping above such keys."""
    return table is not None and _matcher(table)(key)


def _matcher(table: dict[str, Check]) -> Callable[[str], bool]:
    literal, wild = _prefixes(tuple({**table, **OPEN}))
    return lambda key: key in literal or any(fnmatch.fnmatch(key, prefix) for prefix in wild)


@functools.lru_cache(maxsize=16)
def _prefixes(patterns: tuple[str, ...]) -> tuple[frozenset[str], tuple[str, ...]]:
    """Every leading part of the patterns (recipe, recipe.qat, recipe.qat.seed): the plain ones as a set (a key is
    looked up, not matched against ~300 patterns: the check runs on every key of every run), those with `*`."""
    literal: set[str] = set()
    wild: dict[str, None] = {}
    for pattern in patterns:
        parts = pattern.split(".")
        for n in range(1, len(parts) + 1):
            prefix = ".".join(parts[:n])
            if any(c in prefix for c in "*?["):
                wild[prefix] = None
            else:
                literal.add(prefix)
    return frozenset(literal), tuple(wild)


def names_at(parts: Sequence[str], depth: int, patterns: Iterable[str], mappings_only: bool = False) -> set[str]:
    """The names the patterns have at parts[depth] under parts[:depth] (matched part by part, so `*` rows count):
    what an unknown name at that level may have meant. mappings_only: only names with keys below them."""
    names = set()
    for pattern in patterns:
        pattern_parts = pattern.split(".")
        if len(pattern_parts) > depth + mappings_only and all(
            fnmatch.fnmatchcase(part, p) for part, p in zip(parts[:depth], pattern_parts, strict=False)
        ):
            names.add(pattern_parts[depth])
    return {name for name in names if "*" not in name}


def closest(name: str, names: Iterable[str]) -> list[str]:
    """The did-you-mean of an unknown name (of a key or a group), nearest first: a command-line override's
    (config.overrides) and a YAML file's (check_config)."""
    return difflib.get_close_matches(name, sorted(names), n=3)


def _key_table(table: dict[str, Check]) -> dict[str, Check]:
    """The keys a config of this table may hold: its rules, and the logger switches where it has a logger."""
    return {**table, **SWITCHES} if any(k.startswith("logger.") for k in table) else table


def _listed_below(key: str, patterns: Iterable[str]) -> bool:
    parts = key.split(".")
    for pattern in patterns:
        pattern_parts = pattern.split(".")
        if len(pattern_parts) > len(parts) and all(map(fnmatch.fnmatchcase, parts, pattern_parts)):
            return True
    return False


def unknown_keys(cfg: DictConfig, table: dict[str, Check]) -> list[str]:
    """The keys of cfg that no table has, in the config's order (nothing resolved). Below a key whose rule is
    `anything` and which has no keys listed under it is its consumer's value (trainer.max_time's timedelta fields)."""
    allowed = _key_table(table)
    is_known = _matcher(allowed)
    unknown: list[str] = []

    def walk(node: DictConfig, prefix: str) -> None:
        for name in node.keys():
            key = prefix + str(name)
            if not prefix and key == "hydra":  # Hydra's own node, where a composition keeps it: Hydra's to check
                continue
            if not is_known(key):
                unknown.append(key)
                continue
            child = node._get_node(name)
            if not isinstance(child, DictConfig) or child._is_none():
                continue
            free = rule_for(key, {**allowed, **OPEN}) is anything and not _listed_below(key, [*allowed, *OPEN])
            if not free:
                walk(child, key + ".")

    walk(cfg, "")
    return unknown


def _unknown_line(cfg: DictConfig, keys: list[str], table: dict[str, Check]) -> str:
    """One line for the keys no table has: per key, the file that set it and the key meant."""
    sources = where_set(keys)
    allowed = _key_table(table)
    patterns = [*allowed, *OPEN, *(SET_BY_IMGCLS if "trainer.accelerator" in table else {})]
    said: list[str] = []
    previous = ""
    for key in keys:
        parts = key.split(".")
        depth = len(parts) - 1  # unknown_keys stops at the first name no table has
        parent = ".".join(parts[:depth])
        where = f"a key of {parent}" if parent else "a config key"
        node = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        groups = [str(k) for k in node.keys() if known(str(k), allowed)] if isinstance(node, DictConfig) else []
        meant = closest(parts[depth], names_at(parts, depth, patterns))
        if key in SET_BY_IMGCLS:
            instead = SET_BY_IMGCLS[key]
            why = f"{key} is set by imgcls" + (f"; use {instead}" if instead else "")
        elif depth == 0 and groups:
            # A file of a config group (conf/local/default.yaml) without `# @package _global_` puts its keys
            # under its group's name, where nothing reads them.
            why = (
                f"{key} is not a config key: the file's keys land under {key}, its group; start the file with "
                f"`# @package _global_` to set {', '.join(groups)}"
            )
        elif meant:
            why = f"{key} is not {where}; did you mean {'.'.join([*parts[:depth], meant[0]])}?"
        else:
            names = ", ".join(sorted(names_at(parts, depth, patterns)))
            why = f"{key} is not {where}; " + (f"the keys of {parent or 'the config'}: {names}" if names else
                                                f"{parent} takes no keys")  # fmt: skip
        source = ", ".join(sources[key])
        said.append(f"{source}: {why}" if source and (not said or source != previous) else why)
        previous = source
    return " | ".join(said)


def _shown(value: Any) -> str:
    if isinstance(value, ListConfig):
        value = OmegaConf.to_container(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # a float field holds recipe.lr_per_256=-1 as -1.0 (config/schema.py): say it as typed
    return str(value)


def _check_host_resize(data: DictConfig) -> None:
    """dali_cpu's train resize in torch (data/dali/host_resize.py): DALI's policies run after DALI's own resize."""
    if data.get("augment"):
        raise ConfigError(
            f"data.dali_train_resize=torch cannot run data.augment={data.augment} (a DALI policy applied after "
            "DALI's resize); use data.dali_train_resize=dali or auto"
        )
    if data.get("interpolation") not in HOST_RESIZE_MODES:
        raise ConfigError(
            f"data.dali_train_resize=torch has no {data.get('interpolation')} resize; "
            f"use data.interpolation={'|'.join(HOST_RESIZE_MODES)} or data.dali_train_resize=dali"
        )


def _check_progressive(data: DictConfig) -> None:
    """data.progressive's cross-key rules (data/progressive.py builds the schedule from a config that passes them)."""
    prog = data.progressive
    end_size = prog.end_size or data.image_size  # null: the final size is data.image_size
    start_size = prog.start_size or end_size
    if start_size > end_size:
        raise ConfigError(
            f"data.progressive.start_size={start_size} must be a positive size no larger than end_size={end_size}"
        )
    total, stages = prog.total_epochs, prog.get("stages")
    if stages is not None and stages > total:
        raise ConfigError(f"data.progressive.stages={stages} must be between 1 and the epochs ({total})")
    start_epoch, end_epoch = prog.get("start_epoch") or 0, prog.get("end_epoch")
    if stages is None and end_epoch is not None and end_epoch <= start_epoch:
        raise ConfigError(
            f"data.progressive.end_epoch={end_epoch} must be after start_epoch={start_epoch} (the ramp's first epoch)"
        )
    if prog.get("start_magnitude") is not None and data.get("augment") != "randaugment":
        raise ConfigError(
            f"data.progressive.start_magnitude ramps RandAugment, but data.augment={_shown(data.get('augment'))}; "
            "set data.augment=randaugment or start_magnitude=null"
        )


def check_config(cfg: DictConfig, table: dict[str, Check] | None = None, warn: bool = True) -> None:
    """Raise ConfigError for the first value the table does not allow (or an odd batch with mixup); warn about
    a warmup as long as the run (unless warn=False: the CLI's early check, before the command checks again)."""
    table = TRAIN if table is None else table
    if unknown := unknown_keys(cfg, table):  # first: a typo leaves the setting it meant at its default
        raise ConfigError(_unknown_line(cfg, unknown, table))
    for key, value in leaves(cfg):
        check = rule_for(key, table)
        allowed = check(value) if check is not None else None
        if allowed is not None:
            raise ConfigError(f"{key}={_shown(value)} must be {allowed}")
    recipe, data = cfg.get("recipe"), cfg.get("data")
    if recipe is not None and data is not None and (recipe.get("mixup") or recipe.get("cutmix")):
        batch = data.get("batch_size")
        if batch is not None and batch % 2:  # every batch would lose a sample (module._mix)
            raise ConfigError(
                f"data.batch_size={batch} must be even with recipe.mixup={recipe.get('mixup')} / "
                f"recipe.cutmix={recipe.get('cutmix')} (timm's Mixup pairs the samples of a batch)"
            )
    if data is not None and data.get("augment") == "autoaugment" and str(data.get("backend")).startswith("dali"):
        policy = data.get("autoaugment_policy")
        if policy != "v0":  # DALI's only ImageNet AutoAugment policy is v0 (data/dali/pipelines.py)
            raise ConfigError(
                f"data.autoaugment_policy={policy} must be v0 with data.backend={data.backend} (DALI's AutoAugment "
                "has the v0 policy only); use data.backend=torchvision for another policy"
            )
    if recipe is not None and recipe.get("schedule") == "exponential":
        for key in ("lr_decay_rate", "lr_decay_epochs"):  # scheduler.py: x lr_decay_rate every lr_decay_epochs
            if recipe.get(key) is None:
                raise ConfigError(
                    f"recipe.{key}=null must be set with recipe.schedule=exponential (e.g. as recipe=tf2_efficientnet "
                    "sets it: lr_decay_rate=0.97, lr_decay_epochs=2.4)"
                )
    if recipe is not None and str(recipe.get("optimizer")).startswith("rmsprop"):
        for key in ("rmsprop_alpha", "rmsprop_eps"):
            if recipe.get(key) is None:
                raise ConfigError(
                    f"recipe.{key}=null must be set with recipe.optimizer={recipe.optimizer} (e.g. as "
                    "recipe=tf2_efficientnet sets it: rmsprop_alpha=0.9, rmsprop_eps=0.001)"
                )
    model = cfg.get("model")
    if recipe is not None and recipe.get("qat") and model is not None and not model.get("weights"):
        raise ConfigError(
            f"recipe={recipe.get('name')} fine-tunes a trained network with fake INT8 quantizers: set "
            "model.weights=PATH (a checkpoint or weights file of the fp32 network)"
        )
    callbacks, trainer = cfg.get("callbacks"), cfg.get("trainer")
    patience = callbacks.get("early_stopping_patience") if callbacks is not None else None
    if patience and trainer is not None and trainer.get("limit_val_batches") == 0:  # 0: NVIDIA --training-only
        raise ConfigError(
            f"callbacks.early_stopping_patience={patience} needs validation (trainer.limit_val_batches=0 skips it)"
        )
    checkpoint = callbacks.get("checkpoint") if callbacks is not None else None
    monitor = checkpoint.get("monitor") if checkpoint is not None else None
    if monitor and recipe is not None:
        if str(monitor).startswith("val_ema.") and not recipe.get("ema_decay"):
            raise ConfigError(
                f"callbacks.checkpoint.monitor={monitor} needs the EMA copy that validation reports it for: set "
                "recipe.ema_decay (e.g. 0.9999), or monitor val.top1"
            )
        if str(monitor).endswith(".loss_smoothed") and not recipe.get("label_smoothing"):
            raise ConfigError(
                f"callbacks.checkpoint.monitor={monitor} is logged only with label smoothing "
                f"(recipe.label_smoothing={recipe.get('label_smoothing')}); monitor val.loss or val.top1"
            )
    if trainer is not None and trainer.get("accelerator") == "cpu":
        devices = trainer.get("devices")
        if devices == -1 or devices == "-1" or isinstance(devices, ListConfig) or "," in str(devices):
            raise ConfigError(
                f"trainer.devices={devices} names GPUs, but trainer.accelerator=cpu runs processes: give their "
                "number (e.g. trainer.devices=2)"
            )
    if table is TRAIN and data is not None and data.get("backend") == "synthetic" and not data.get("num_classes"):
        # No folder to count classes in (evaluate's null is the checkpoint's count).
        raise ConfigError("data.num_classes must be set for the synthetic backend (e.g. 1000)")
    if data is not None and data.get("backend") == "dali_cpu" and data.get("dali_train_resize") == "torch":
        _check_host_resize(data)
    if data is not None and data.get("progressive") and data.progressive.get("enabled"):
        _check_progressive(data)
    precision = cfg.get("precision")
    if data is not None and data.get("dali_fp16") is True and precision is not None:
        # Autocast (fp16 or bf16) casts the half images at the first conv; fp32/tf32 convs would get Half input.
        if precision.get("lightning") not in ("16-mixed", "bf16-mixed"):
            raise ConfigError(
                f"data.dali_fp16=true needs precision=amp or bf16 (autocast); precision={precision.get('name')} "
                "runs fp32 layers on the half images"
            )
    if warn and (line := _workers_line(cfg.get("hardware"), data)) is not None:
        log.warning("%s", line)
    if warn and data is not None and data.get("train_crop") == "tf" and data.get("train_crop_object_boxes"):
        if data.get("format") != "tfrecord":  # TF1's crop (data/tf_crop.py uses_object_boxes) without boxes
            log.warning(
                "data.train_crop_object_boxes=true (TF1's crop covers ImageNet's object boxes) with data.format=%s, "
                "which carries no boxes: the crop samples against the whole image, as TF2's; NVIDIA's TF1 runs read "
                "the boxes from TFRecords (data.format=tfrecord)",
                data.get("format"),
            )
    if warn and recipe is not None and trainer is not None and recipe.get("epochs") is not None:
        max_epochs = trainer.get("max_epochs")
        if isinstance(max_epochs, int) and max_epochs > int(recipe.epochs):
            log.warning(
                "trainer.max_epochs=%d is longer than the schedule (recipe.epochs=%d): the epochs after it train at "
                "the learning rate the schedule ends with; recipe.epochs=%d stretches the schedule instead",
                max_epochs, int(recipe.epochs), max_epochs,
            )  # fmt: skip
    if warn and recipe is not None and recipe.get("warmup_epochs") is not None and recipe.get("epochs") is not None:
        warmup, epochs = float(recipe.warmup_epochs), int(recipe.epochs)
        if warmup >= epochs:
            log.warning(
                "recipe.warmup_epochs=%g is not shorter than the run (recipe.epochs=%d): the learning rate is "
                "still warming up when training ends and never reaches its peak or decays",
                warmup, epochs,
            )  # fmt: skip


def _workers_line(hardware: DictConfig | None, data: DictConfig | None) -> str | None:
    """The loader workers are one setting with one key a user sets, data.num_workers (NVIDIA's -j/--workers);
    hardware.num_workers is the profile's value for its machine, which data.num_workers defaults to. A run that
    changes the profile's value instead still works (data.num_workers follows it) but gets this one line, so that
    the two names stop being used for one thing."""
    if hardware is None or data is None or not OmegaConf.is_interpolation(data, "num_workers"):
        return None
    name = str(hardware.get("name"))
    profile = CONF_DIR / "hardware" / f"{name}.yaml"
    shipped = group_option("hardware", name).get("num_workers") if profile.is_file() else None
    value = hardware.get("num_workers")
    if shipped is None or value == shipped:
        return None
    return (
        f"hardware.num_workers={value} changes hardware={hardware.name}'s value ({shipped}); set "
        f"data.num_workers={value}, the one key of the loader workers (hardware.num_workers is the profile's)"
    )
