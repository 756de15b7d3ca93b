"""Command-line entry points: Hydra composition, friendly one-line errors, exit codes.

`train.py` / `evaluate.py` at the repository root and the `imgcls-train` / `imgcls-evaluate` console
scripts all end up here.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from imgcls.errors import UserError

CONF_DIR = Path(__file__).resolve().parent / "conf"
GROUPS = ("model", "precision", "hardware", "recipe", "data", "logger", "callbacks", "trainer", "experiment")
log = logging.getLogger("imgcls")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


def check_group_choices(argv: list[str]) -> None:
    """Unknown config-group choices end with one line naming the allowed values (before Hydra's
    multi-line message with a search path)."""
    overrides = [a for a in argv if not a.startswith("-") and "=" in a]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - Hydra reports its own syntax errors clearly
        return
    for override in parsed:
        group = override.key_or_group
        if group not in GROUPS or override.is_delete():
            continue
        values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
        allowed = options(group)
        for value in values:
            if value is not None and str(value) not in allowed and str(value) != "null":
                fail(f"{group}={value} is not a known {group}; allowed: {', '.join(allowed)}")


def fail(message: str, code: int = 2) -> None:
    print(f"imgcls: error: {message}", file=sys.stderr)
    sys.exit(code)


def guarded(fn: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """Run fn; a UserError becomes one line on stderr and exit code 2, never a traceback."""
    try:
        return fn(cfg)
    except UserError as exc:
        fail(str(exc), exc.exit_code)
    except MissingMandatoryValue as exc:
        fail(f"{exc.full_key} must be set (e.g. {exc.full_key}=...)")
    finally:
        _finish_wandb()


def _finish_wandb() -> None:
    # Close a W&B run so that the next job of a multirun sweep starts clean.
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("imgcls.first"):
        # ${imgcls.first:a,b}: the first value that is not null (oc.select keeps an explicit null).
        OmegaConf.register_new_resolver(
            "imgcls.first", lambda *values: next((v for v in values if v is not None), None)
        )


register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def _train(cfg: DictConfig) -> Any:
    from imgcls.train import run

    summary = guarded(run, cfg)
    return (summary or {}).get("val.top1")


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def _evaluate(cfg: DictConfig) -> Any:
    from imgcls.evaluate import run

    return guarded(run, cfg)


@hydra.main(version_base="1.3", config_path="conf", config_name="classify")
def _classify(cfg: DictConfig) -> Any:
    from imgcls.classify import run

    result = guarded(run, cfg)
    if result and result.get("failed"):
        sys.exit(1)  # some images could not be read; they were reported by name, the others classified
    return result


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def _export(cfg: DictConfig) -> Any:
    from imgcls.export import run

    return guarded(run, cfg)


def train_main() -> None:
    check_group_choices(sys.argv[1:])
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    _train()


def evaluate_main() -> None:
    check_group_choices(sys.argv[1:])
    _evaluate()


def classify_main() -> None:
    # `--json` as well as Hydra's json=true: the flag scripts expect.
    sys.argv = [a if a != "--json" else "json=true" for a in sys.argv]
    check_group_choices(sys.argv[1:])
    _classify()


def export_main() -> None:
    check_group_choices(sys.argv[1:])
    _export()
