"""Command-line entry points: where commands and their modes are chosen, with one-line errors and exit codes.

`train.py` / `evaluate.py` at the repository root, `python -m imgcls.classify` / `python -m imgcls.export`
and the `imgcls-*` console scripts all end up here. Nothing in imgcls imports this module.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from imgcls.config import options
from imgcls.config_checks import EVALUATE, TRAIN, Check, check_config
from imgcls.errors import ConfigError, UserError
from imgcls.hardware import resolve_auto_hardware
from imgcls.log_setup import route_library_logs
from imgcls.rundir import launch_overrides, task_name

# Nothing above imports torch, timm or Lightning: a command that ends with a one-line error (an unknown group
# choice, a bad value, a missing ckpt=) exits in about a second instead of importing them first (~6 s of CPU).
# The modules that do the work are imported by name once the config has passed its checks (`_function`).

GROUPS = (
    "model", "precision", "hardware", "recipe", "data", "logger", "callbacks", "trainer", "experiment",
    "hparams_search", "debug",
)  # fmt: skip
log = logging.getLogger("imgcls")


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
                fail(f"{group}={value} {_why_unknown(group, str(value), allowed)}; allowed: {', '.join(allowed)}")


def _why_unknown(group: str, value: str, allowed: list[str]) -> str:
    """NVIDIA's --arch names are spelled with '-'; one of them names no network at all."""
    if group == "model" and value.replace("-", "_") == "resnext101_32x8d_basic":
        return "is only in the --arch list of NVIDIA's stale README usage block: no NVIDIA code ever defined it"
    if group == "model" and value.replace("-", "_") in allowed:
        return f"is NVIDIA's --arch spelling; imgcls's is model={value.replace('-', '_')}"
    return f"is not a known {group}"


def fail(message: str, code: int = 2) -> None:
    print(f"imgcls: error: {message}", file=sys.stderr)
    sys.exit(code)


# (line, exit code) per multirun job that ended with a user error; train_main exits with the highest code.
SWEEP_FAILURES: list[tuple[str, int]] = []


def guarded(fn: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """Run fn; a UserError becomes one line on stderr and exit code 2, never a traceback.

    In a multirun (-m) the job instead logs that line and returns None (a failed status: Optuna marks
    the trial failed), so that the next job still runs; after the sweep train_main exits with the highest
    exit code of the failed jobs (2 input, 3 training, 4 storage), 0 if none failed."""
    try:
        return fn(cfg)
    except (UserError, MissingMandatoryValue) as exc:
        if isinstance(exc, UserError):
            message, code = str(exc), exc.exit_code
        else:
            message, code = f"{exc.full_key} must be set (e.g. {exc.full_key}=...)", 2
        if not _in_multirun():
            fail(message, code)
        job = f"job {HydraConfig.get().job.num} ({','.join(_varying_overrides())})"
        log.error("%s failed: %s", job, message)
        SWEEP_FAILURES.append((f"{job}: {message}", code))
        return None
    finally:
        _finish_wandb()


def _varying_overrides() -> list[str]:
    """This job's overrides of keys that the command line sweeps or does not set (a sweeper's params)."""
    task = list(HydraConfig.get().overrides.task)
    try:
        given = OverridesParser.create().parse_overrides([a for a in sys.argv[1:] if "=" in a and a[0] != "-"])
    except Exception:  # noqa: BLE001 - only for naming the job
        return task
    fixed = {o.key_or_group for o in given if not o.is_sweep_override()}
    return [o for o in task if o.split("=", 1)[0].lstrip("+~") not in fixed] or task


def _in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def refuse_in_process_ddp_sweep(cfg: DictConfig) -> None:
    """Hydra multirun x DDP spawned by Lightning inside the sweep process is not supported (Lightning
    removed it in 1.8 because processes hung; its children would re-run the whole sweep). A launcher that
    starts each job as its own cluster job (submitit) is fine."""
    if not _in_multirun() or "submitit" in str(HydraConfig.get().launcher.get("_target_", "")):
        return
    from imgcls.plan import world_size_of  # torch: only for a multirun

    resolve_auto_hardware(cfg)  # hardware=auto on an 8-GPU machine is 8 devices, not the 1 of its unresolved node
    try:
        world_size = world_size_of(cfg.trainer, check_devices=False)
    except UserError:
        return  # the job itself reports the bad value
    if world_size > 1:
        fail(
            f"a multirun (-m) cannot start {world_size} DDP processes per job itself; sweep multi-GPU jobs with "
            "hydra/launcher=slurm, or launch each job as its own torchrun/srun run (docs/distributed.md)"
        )


def _finish_wandb() -> None:
    # Close a W&B run so that the next job of a multirun sweep starts clean.
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


# The modes of each command (`mode=`): NVIDIA's benchmark_training / benchmark_inference next to the real thing,
# as "module:function" (imported when chosen), and the check table every mode of the command applies first.
TRAIN_MODES: dict[str, str] = {
    "train": "imgcls.train:run",
    "benchmark": "imgcls.bench.training:run",
    "plan": "imgcls.plan:show",
}
EVALUATE_MODES: dict[str, str] = {"evaluate": "imgcls.evaluate:run", "benchmark": "imgcls.bench.inference:run"}


def _function(target: str) -> Callable[[DictConfig], Any]:
    module, name = target.split(":")
    function = getattr(importlib.import_module(module), name)
    # Lightning, imported only now, after Hydra configured logging: its loggers go through Hydra's handlers.
    route_library_logs()
    return function


def run_mode(modes: dict[str, str], cfg: DictConfig, table: dict[str, Check]) -> Any:
    """Run the function of cfg.mode. Each one checks the config itself first; checking it here too (without
    repeating warnings) reports a bad value before torch is imported, with the same line.

    hardware=auto is resolved right after that check, not before: resolving imports torch (CUDA's query), and
    the unresolved node (cpu's values) passes the same checks as any profile; each mode checks the resolved
    config again. Resolving here once logs the choice once, before the mode's imports."""
    mode = str(cfg.get("mode") or next(iter(modes)))
    if mode not in modes:
        raise ConfigError(f"mode={mode} is not allowed; use {' or '.join(modes)}")
    check_config(cfg, table, warn=False)
    resolve_auto_hardware(cfg)  # nothing for evaluate's config, which has no hardware profile
    return _function(modes[mode])(cfg)


def run_train(cfg: DictConfig) -> Any:
    return run_mode(TRAIN_MODES, cfg, TRAIN)


def run_evaluate(cfg: DictConfig) -> Any:
    return run_mode(EVALUATE_MODES, cfg, EVALUATE)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def _train(cfg: DictConfig) -> Any:
    route_library_logs()
    refuse_in_process_ddp_sweep(cfg)
    summary = guarded(run_train, cfg)
    return (summary or {}).get("val.top1")


@hydra.main(version_base="1.3", config_path="conf", config_name="evaluate")
def _evaluate(cfg: DictConfig) -> Any:
    route_library_logs()
    return guarded(run_evaluate, cfg)


@hydra.main(version_base="1.3", config_path="conf", config_name="classify")
def _classify(cfg: DictConfig) -> Any:
    route_library_logs()
    result = guarded(_function("imgcls.classify:run"), cfg)
    if result and result.get("failed"):
        sys.exit(1)  # some images could not be read; they were reported by name, the others classified
    return result


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def _export(cfg: DictConfig) -> Any:
    route_library_logs()
    return guarded(_function("imgcls.export:run"), cfg)


def train_main() -> None:
    check_group_choices(sys.argv[1:])
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    try:  # torchrun/srun: one run dir for all ranks, Hydra's files from rank 0 only (rundir.py)
        sys.argv += launch_overrides(sys.argv[1:], task_name(sys.argv[1:], "train"))
    except UserError as exc:
        fail(str(exc), exc.exit_code)
    _train()
    if SWEEP_FAILURES:
        lines = [line for line, _ in SWEEP_FAILURES]
        fail(f"{len(lines)} sweep job(s) failed: " + "; ".join(lines), max(code for _, code in SWEEP_FAILURES))


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
