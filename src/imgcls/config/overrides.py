"""The command line's overrides checked before Hydra runs a command: each mistake is one ConfigError line with a
did-you-mean (difflib over the keys and group choices that exist), instead of Hydra's multi-line message and
exit code 1.

Hydra stays the judge of what composes: the overrides are parsed with Hydra's own parser and composed with
Hydra's compose API, and its exceptions are translated. What Hydra lets through and imgcls does not:
`+KEY=...` for a key that is neither in the composed config nor in the command's check table (config/checks.py:
a key of another group option, one inside a `*` pattern, or in OPEN's namespaces such as data.storage_options for
fsspec), and the lightning.Trainer arguments imgcls sets itself from other keys. The trainer node is closed: it
holds every lightning.Trainer argument already (tests/test_trainer_args.py), so `+trainer.X` is a typo.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser  # Hydra's own flags: no public API has them, a copy would drift
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, Override
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException, ValidationError

from imgcls.config import schema
from imgcls.config.checks import SET_BY_IMGCLS, Check, closest, known, names_at, rule_for
from imgcls.config.compose import CONF_DIR, options
from imgcls.config.hardware import refuse_auto_on_a_cluster_launcher
from imgcls.errors import ConfigError

# The config groups whose choices are checked before composing (train.yaml's defaults list).
GROUPS = (
    "model", "precision", "hardware", "recipe", "data", "logger", "callbacks", "trainer", "experiment",
    "hparams_search", "debug",
)  # fmt: skip
GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic"


def override_args(argv: list[str]) -> tuple[list[str], bool] | None:
    """The overrides of a Hydra command line (Hydra's own argument parser) and whether it is a multirun (-m);
    None where Hydra prints something instead of running (--help, --info, ...) or composes another config
    (--config-name/-path/-dir): Hydra's affair."""
    args = get_args_parser().parse_args(argv)
    own = (args.help, args.hydra_help, args.info, args.shell_completion, args.experimental_rerun)
    if any(own) or args.config_name or args.config_path or args.config_dir:
        return None
    overrides = list(args.overrides)
    return overrides, bool(args.multirun) or "hydra.mode=MULTIRUN" in overrides


def is_positional(arg: str) -> bool:
    """A path rather than KEY=VALUE: no '=' in it, or a file or folder of that name."""
    return "=" not in arg or os.path.exists(arg)


def check_command_line(config_name: str, argv: list[str], table: dict[str, Check] | None = None) -> None:
    """Raise ConfigError for the first mistake in argv's overrides of conf/CONFIG_NAME.yaml: one that Hydra
    cannot parse, an unknown group choice, a key imgcls sets itself, a key that does not exist (with or without
    `+`; known: in the composed config or matched by `table`), or anything else Hydra refuses to compose."""
    command_line = override_args(argv)
    if command_line is None:
        _check_yaml_values_of_own_dirs(config_name, argv, table)
        return
    args, multirun = command_line
    parsed = [parse(arg, config_name) for arg in args]
    for override in parsed if table is not None else ():  # the commands with a Trainer (train, evaluate)
        key = override.key_or_group
        if key in SET_BY_IMGCLS and not override.is_delete():
            instead = SET_BY_IMGCLS[key]
            raise ConfigError(f"{key} is set by imgcls" + (f"; use {instead}" if instead else ""))
    check_group_choices(parsed)
    if any(_is_group(o) and o.is_add() and not _is_hydra(o) for o in parsed):  # Hydra would add any group
        _check_groups(config_name, parsed)
    additions = [o for o in parsed if (o.is_add() or o.is_force_add()) and not _is_group(o) and not _is_hydra(o)]
    try:
        cfg = _compose(config_name, _jobs((o for o in parsed if o not in additions), multirun))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_composition_error(config_name, parsed, exc, table, multirun)) from None
    if multirun:
        refuse_auto_on_a_cluster_launcher(cfg, _choices(parsed, "hardware"))
    for override in parsed:
        if not _is_group(override) and (whole := _set_whole(cfg, override)) is not None:
            raise ConfigError(whole)
        if table is not None and (added := _added_to_a_schema_group(cfg, override, table)) is not None:
            raise ConfigError(added)
    for override in additions:
        exists = _find(cfg, override.key_or_group)
        if override.is_add() and exists and not _schema_null(cfg, override.key_or_group):
            raise ConfigError(
                f"{override.input_line}: {override.key_or_group} is already a key; set it without the +: "
                f"{_line(override).lstrip('+')}"
            )
        if not exists and not known(override.key_or_group, table):
            raise ConfigError(_unknown_key(cfg, override, table))


def parse(arg: str, config_name: str) -> Override:
    """One override, by Hydra's parser; a malformed one is one line saying why, with what was likely meant."""
    try:
        override = OverridesParser.create().parse_override(arg)
    except HydraException as exc:
        lines = [line.strip() for line in str(exc).splitlines()]
        reason = next((line for line in lines if line and not line.startswith(("Error parsing", "See "))), "")
        reason = reason.split(" expecting ")[0].removeprefix("LexerNoViableAltException: ")
        if "=" not in arg:
            raise ConfigError(f"{arg} is not an override KEY=VALUE{_meant(arg, config_name)}") from None
        raise ConfigError(
            f"cannot parse the override {arg} ({reason}); quote a value with spaces or special characters "
            f"(key='a value'), see {GRAMMAR}"
        ) from None
    if not override.key_or_group:
        raise ConfigError(f"{arg} is not an override KEY=VALUE: it names no key")
    return override


def _meant(word: str, config_name: str) -> str:
    """A bare word: the group choice or the checkpoint it likely is."""
    for group in GROUPS:
        if word in options(group):
            return f"; did you mean {group}={word}?"
    if os.path.exists(word):
        return f"; did you mean {'ckpt_path' if config_name == 'train' else 'ckpt'}={word}?"
    close = [(group, match) for group in GROUPS for match in difflib.get_close_matches(word, options(group), n=1)]
    return f"; did you mean {close[0][0]}={close[0][1]}?" if close else ""


def check_group_choices(parsed: Iterable[Override]) -> None:
    """Unknown config-group choices end with one line naming the allowed values (before Hydra's multi-line
    message with a search path)."""
    for override in parsed:
        group = override.key_or_group
        if group not in GROUPS or override.is_delete() or not (CONF_DIR / group).is_dir():
            continue
        allowed = options(group)
        value = override.value()
        values: list[Any]
        if isinstance(value, Glob):
            values = [] if value.filter(allowed) else [_line(override).split("=", 1)[1]]
        elif override.is_sweep_override():
            values = list(override.sweep_string_iterator())
        else:
            values = [value]
        for value in values:
            if value is not None and str(value) not in allowed and str(value) != "null":
                raise ConfigError(_unknown_choice(group, str(value), allowed))


def _unknown_choice(group: str, value: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(value, allowed, n=1)
    if group == "model" and value.replace("-", "_") == "resnext101_32x8d_basic":
        why = "is only in the --arch list of NVIDIA's stale README usage block: no NVIDIA code ever defined it"
    elif group == "model" and value.replace("-", "_") in allowed:  # NVIDIA's --arch names are spelled with '-'
        why = f"is NVIDIA's --arch spelling; imgcls's is model={value.replace('-', '_')}"
    else:
        why = f"is not a known {group}" + (f"; did you mean {group}={close[0]}?" if close else ";")
    return f"{group}={value} {why} allowed: {', '.join(allowed)}"


def _is_group(override: Override) -> bool:
    key = override.key_or_group
    return "/" in key or "." not in key and (CONF_DIR / key).is_dir()


def _is_hydra(override: Override) -> bool:
    return _is_hydra_group(override.key_or_group.split(".")[0])


def _is_hydra_group(name: str) -> bool:
    return name.split("/")[0] == "hydra"


def _values(override: Override) -> list[str]:
    """Every value an override gives: one, a sweep's each, a glob's matching group choices (check_group_choices:
    one does); none for interval(), whose values the sweeper draws."""
    value = override.value()
    if isinstance(value, Glob):
        return value.filter(options(override.key_or_group)) if _is_group(override) else []
    if not override.is_sweep_override():
        return [str(value)]
    try:
        return list(override.sweep_string_iterator())
    except HydraException:  # interval(): whether the key exists is Hydra's to say
        return []


def _one_job(override: Override, multirun: bool) -> str | None:
    """The override as Hydra's compose() takes it: a sweep of a multirun (-m) by its first value."""
    if not multirun or not override.is_sweep_override():
        return override.input_line
    values = _values(override)
    return f"{override.get_key_element()}={values[0]}" if values else None


def _choices(overrides: Iterable[Override], group: str) -> list[str]:
    """Every value the command line gives GROUP, each of a sweep's values too."""
    return [v for o in overrides if o.key_or_group == group and not o.is_delete() for v in _values(o)]


def _jobs(overrides: Iterable[Override], multirun: bool) -> list[str]:
    return [job for job in (_one_job(o, multirun) for o in overrides) if job is not None]


def _check_yaml_values_of_own_dirs(config_name: str, argv: list[str], table: dict[str, Check] | None) -> None:
    """--config-path/--config-dir (a user's own conf/ or options): the command line is Hydra's affair, but a YAML
    value of the wrong type there would end in Hydra's multi-line error, exit 1. Composed once as Hydra will (the
    primary folder, the extra one in the search path) only to turn that error into imgcls's one line; any other
    failure is left to Hydra, which reports it when it composes."""
    args = get_args_parser().parse_args(argv)
    own = (args.help, args.hydra_help, args.info, args.shell_completion, args.experimental_rerun, args.config_name)
    if any(own) or not (args.config_path or args.config_dir):
        return
    primary = Path(args.config_path) if args.config_path else CONF_DIR
    if not primary.is_absolute():  # hydra.main's config_path is relative to the file declaring it (imgcls/cli.py)
        primary = CONF_DIR.parent / primary
    for flag, folder in (("--config-dir", args.config_dir), ("--config-path", args.config_path and primary)):
        if folder and not Path(folder).expanduser().is_dir():  # Hydra: a warning, then 4 lines and exit 1
            raise ConfigError(f"{flag} {folder} is not a folder; it names a folder of config groups (conf/'s layout)")
    extra = [f"hydra.searchpath=[file://{Path(args.config_dir).resolve()}]"] if args.config_dir else []
    jobs = [a for a in args.overrides if "," not in a.split("=", 1)[-1]]  # one job of a sweep is enough here
    try:
        with initialize_config_dir(config_dir=str(primary.resolve()), version_base="1.3"):
            compose(config_name=config_name, overrides=[*jobs, *extra])
    except (HydraException, OmegaConfBaseException) as exc:
        dirs = (primary, *([Path(args.config_dir)] if args.config_dir else []))
        if (line := _yaml_value_error(exc, table, dirs)) is not None:
            raise ConfigError(line) from None
    except Exception:  # noqa: BLE001 - Hydra names whatever else it refuses when it composes for the run
        return


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    if GlobalHydra.instance().is_initialized():  # called inside a Hydra app: its config dir
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=True)


def _find(cfg: DictConfig, key: str) -> bool:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or node._is_none() or part not in node.keys():
            return False
        node = node._get_node(part)
    return True


def _set_whole(cfg: DictConfig, override: Override) -> str | None:
    """A key inside a value that an interpolation computes as a whole (an experiment's `expected`, NVIDIA's
    published result: ${imgcls.published:...}): Hydra cannot set or remove a part of it (a removal passes and does
    nothing), the user can set all of it."""
    parts = override.key_or_group.split(".")
    node: Any = cfg
    for depth, part in enumerate(parts[:-1]):
        if not isinstance(node, DictConfig) or part not in node.keys():
            return None
        node = node._get_node(part)
        if node._is_interpolation():
            whole = ".".join(parts[: depth + 1])
            try:
                keys = ", ".join(str(k) for k in OmegaConf.select(cfg, whole).keys())
            except Exception:  # noqa: BLE001 - only to name the keys; the line stands without them
                keys = ""
            if override.is_delete():
                action, example = "removed", f"{whole}=null"
            else:
                value = "VALUE" if override.is_sweep_override() else _line(override).split("=", 1)[1]
                for name in reversed(parts[depth + 1 :]):
                    value = f"{{{name}:{value}}}"
                action, example = "set", f"{whole}={value}"
            return (
                f"{_line(override)}: {whole} is computed as a whole ({node._value()}"
                + (f": {keys}" if keys else "")
                + f"), so a key inside it cannot be {action}; set {whole} itself, e.g. {example}"
            )
    return None


def _added_to_a_schema_group(cfg: DictConfig, override: Override, table: dict[str, Check]) -> str | None:
    """`GROUP.KEY=VALUE` of a key no table has, in a group whose options extend its schema (config/schema.py): that
    node is not struct (a YAML typo reaches config.checks, which names the file), so Hydra added the key."""
    key = override.key_or_group
    if _is_group(override) or _is_hydra(override) or override.is_add() or override.is_force_add():
        return None
    if override.is_delete() or known(key, table):
        return None
    group = cfg.get(key.split(".")[0])
    if not isinstance(group, DictConfig) or OmegaConf.get_type(group) not in schema.GROUPS.values():
        return None
    without = copy.deepcopy(cfg)  # the config as a struct group would have left it: the did-you-mean's levels
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(without, parent)
    if isinstance(node, DictConfig) and name in node:
        with open_dict(node):
            del node[name]
    return _unknown_key(without, override, table)


def _schema_null(cfg: DictConfig, key: str) -> bool:
    """A null key of a group's schema (config/schema.py): one only some of the group's options set (model.se_width),
    which `+KEY=` adds where the option leaves it out, as Hydra does for a null."""
    group = cfg.get(key.split(".")[0])
    typed = isinstance(group, DictConfig) and OmegaConf.get_type(group) in schema.GROUPS.values()
    return typed and OmegaConf.select(cfg, key, throw_on_resolution_failure=False) is None


def _value_error(parsed: list[Override], exc: Exception, table: dict[str, Check] | None) -> str | None:
    """`KEY=VALUE must be ALLOWED` for a value the schema's type refuses (OmegaConf's ValidationError under Hydra's
    "Error merging override"): the line a value of the right type outside its range gets (config.checks)."""
    cause = exc.__cause__
    if table is None or not isinstance(cause, ValidationError):
        return None
    key = str(getattr(cause, "full_key", "") or "").split("[")[0]  # a list's item: recipe.lr_milestones[0]
    override = next((o for o in parsed if o.key_or_group == key and not _is_group(o)), None)
    check = rule_for(key, table)
    if override is None or check is None:
        return None
    value = _line(override).split("=", 1)[1]
    allowed = check(override.value()) or check(object())
    return f"{key}={value} must be {allowed}" if allowed else None


def _composition_error(
    config_name: str, parsed: list[Override], exc: Exception, table: dict[str, Check] | None, multirun: bool
) -> str:
    """One line for Hydra's refusal: the key override it failed on (checked against the config its group
    choices compose), an unknown choice of a group of Hydra's own, or Hydra's message on one line."""
    if (bad_value := _value_error(parsed, exc, table)) is not None:
        return bad_value
    if (bad_yaml := _yaml_value_error(exc, table)) is not None:
        return bad_yaml
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options:
        group, _, value = exc.missing_cfg_file.rpartition("/")
        return _unknown_choice(group, value, sorted(exc.options))
    groups = [o for o in parsed if _is_group(o)]
    try:
        base = _compose(config_name, _jobs(groups, multirun))
    except (HydraException, OmegaConfBaseException):
        base = None
    if base is not None:
        for override in parsed:
            if _is_group(override) or override.is_add() or override.is_force_add():
                continue
            if (whole := _set_whole(base, override)) is not None:
                return whole
            if not _find(base, override.key_or_group):
                if known(override.key_or_group, table) and not override.is_delete():
                    return (
                        f"{override.input_line}: {override.key_or_group} is not in this config; add it with "
                        f"+{override.input_line}"
                    )
                return _unknown_key(base, override, table)
    else:
        _check_groups(config_name, parsed)
    lines = [line.strip().rstrip(".") for line in str(exc).split("Config search path")[0].splitlines()]
    return "; ".join(line for line in lines if line)


def _yaml_value_error(exc: Exception, table: dict[str, Check] | None, dirs: tuple[Path, ...] = ()) -> str | None:
    """A value of the wrong type in a YAML file (conf/local/default.yaml, an experiment, an option): OmegaConf refuses
    it against the group's schema while Hydra composes that file, before any imgcls check runs. One line naming the
    file, the key, the value and what is allowed (the key's range where it has one, else OmegaConf's type)."""
    cause = exc.__cause__ or exc.__context__
    if not isinstance(exc, ConfigCompositionException) or not isinstance(cause, ValidationError) or not cause.full_key:
        return None
    key, value = str(cause.full_key), cause.value
    found = re.match(r"In '([^']+)'", str(exc))
    where = None
    name = found.group(1) if found else ""
    for folder in (*dirs, CONF_DIR) if name else ():  # Hydra's search order: the user's folders first
        if (path := folder / f"{name}.yaml").is_file():
            where = f"conf/{name}.yaml" if folder == CONF_DIR else _shown_path(path)
            break
    rule = rule_for(key, table) if table is not None else None
    allowed = rule(value) if rule is not None else None
    if allowed is None:  # no range, or one the value meets as text: OmegaConf's own words for the type
        allowed = "a value of type " + str(cause.msg).splitlines()[0].rsplit(" to ", 1)[-1]
    line = f"{key}={value} must be {allowed}"
    return f"{where}: {line}" if where else line


def _shown_path(path: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(Path.cwd())) if resolved.is_relative_to(Path.cwd()) else str(resolved)


def _check_groups(config_name: str, parsed: list[Override]) -> None:
    """A group override of a group the command's defaults list does not have (precision= of classify), or a
    `+GROUP=` of one it has."""
    own = _compose(config_name, []).hydra.runtime.choices
    for override in parsed:
        group = override.key_or_group
        if not _is_group(override) or _is_hydra(override) or override.is_force_add():
            continue
        if group not in own:
            mine = ", ".join(sorted(g for g in own if not _is_hydra_group(g))) or "none"
            raise ConfigError(f"{override.input_line}: {config_name} has no config group {group} (its groups: {mine})")
        if override.is_add():
            raise ConfigError(
                f"{override.input_line}: {group} is already a config group of {config_name}; choose it without the "
                f"+: {_line(override).lstrip('+')}"
            )


def _line(override: Override) -> str:
    """The override as typed. Hydra's parser sets input_line on every override it parses from a string, which is
    how every override here was made; its type allows None for overrides built in code."""
    assert override.input_line is not None
    return override.input_line


def _unknown_key(cfg: DictConfig, override: Override, table: dict[str, Check] | None) -> str:
    """`KEY is not a config key`, with the nearest key at the level where KEY leaves the config (a config
    group preferred at the top where the value is one of its choices: modle=resnet50 -> model=resnet50)."""
    key = override.key_or_group
    parts = key.split(".")
    node: Any = cfg
    for depth, part in enumerate(parts):
        if isinstance(node, DictConfig) and not node._is_none() and part in node.keys():
            node = node._get_node(part)
            continue
        parent = ".".join(parts[:depth])
        deeper = depth < len(parts) - 1  # then only a mapping (or a group) is meant
        level: set[str] = set()
        if isinstance(node, DictConfig) and not node._is_none():
            level = {str(k) for k in node.keys() if not deeper or isinstance(node._get_node(k), DictConfig)}
        reserved = SET_BY_IMGCLS if table is not None else {}  # a typo of one of them is still meant for it
        level |= names_at(parts, depth, [*(table or {}), *reserved], mappings_only=deeper)
        level = {name for name in level if "*" not in name and name != "hydra"}
        line = _line(override)
        value = line.split("=", 1)[1] if "=" in line else None
        close = closest(part, level | (set(GROUPS) if depth == 0 else set()))
        choice = next((g for g in close if depth == 0 and g in GROUPS and value in options(g)), None)
        if choice is not None:
            close = [choice]
        where = f"a key of {parent}" if parent else "a config key"
        if not close:
            names = ", ".join(sorted(level))
            return f"{override.input_line}: {key} is not {where}; " + (
                f"the keys of {parent or 'the config'}: {names}" if names else f"{parent} takes no keys"
            )
        meant = ".".join([*parts[:depth], close[0], *parts[depth + 1 :]])
        if meant in reserved:
            instead = reserved[meant]
            return f"{override.input_line}: {key} is not {where}; {meant} is set by imgcls" + (
                f"; use {instead}" if instead else ""
            )
        prefix = "~" if override.is_delete() else ""
        suggestion = prefix + meant + (f"={value}" if value is not None else "")
        return f"{override.input_line}: {key} is not {where}; did you mean {suggestion}?"
    return f"{override.input_line}: {key} is not a config key"
