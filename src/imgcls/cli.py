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
from omegaconf import DictConfig, ListConfig
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from imgcls.config import overrides
from imgcls.config.checks import EVALUATE, TRAIN, Check, check_config
from imgcls.config.hardware import resolve_auto_hardware
from imgcls.errors import UserError
from imgcls.redaction import redact_overrides, secrets_to_environment
from imgcls.run.log_setup import route_library_logs
from imgcls.run.rundir import launch_overrides, task_name
from imgcls.run.sweep_results import SWEEP_FAILURES  # each failed job's line and exit code (also in the results table)

# Nothing above imports torch, timm or Lightning: a command that ends with a one-line error (an unknown group
# choice, a bad value, a missing ckpt=) exits in about a second instead of importing them first (~6 s of CPU).
# The modules that do the work are imported by name once the config has passed its checks (`_function`).

log = logging.getLogger("imgcls")


def check_command_line(config_name: str, table: dict[str, Check] | None = None) -> None:
    """sys.argv's overrides checked before Hydra runs (imgcls.config.overrides): a mistake is one line, exit code 2.
    Then the credentials typed there leave sys.argv for the environment, before Hydra, W&B or a DDP launcher
    records sys.argv (imgcls.redaction.secrets_to_environment)."""
    try:
        overrides.check_command_line(config_name, sys.argv[1:], table)
    except UserError as exc:
        fail(str(exc), exc.exit_code)
    sys.argv[1:] = secrets_to_environment(sys.argv[1:])


def check_group_choices(argv: list[str]) -> None:
    """Unknown config-group choices end with one line naming the allowed values (and the nearest one)."""
    try:
        command_line = overrides.override_args(argv)
        if command_line is not None:
            overrides.check_group_choices(overrides.parse(arg, "train") for arg in command_line[0])
    except UserError as exc:
        fail(str(exc), exc.exit_code)


def fail(message: str, code: int = 2) -> None:
    print(f"imgcls: error: {message}", file=sys.stderr)
    sys.exit(code)


def guarded(fn: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """Run fn; a UserError becomes one line on stderr and exit code 2, never a traceback.

    In a multirun (-m) the job instead logs that line and returns None (a failed status: Optuna marks
    the trial failed), so that the next job still runs; after the sweep train_main exits with the highest
    exit code of the failed jobs (2 input, 3 training, 4 storage), 0 if none failed."""
    try:
        return fn(cfg)
    except Exception as exc:
        error = user_error(exc)
        if error is None:
            raise
        message, code = error
        if not _in_multirun():
            fail(message, code)
        job = f"job {HydraConfig.get().job.num} ({','.join(redact_overrides(_varying_overrides()))})"
        log.error("%s failed: %s", job, message)
        SWEEP_FAILURES.append((f"{job}: {message}", code))
        return None
    finally:
        _finish_wandb()


def user_error(exc: BaseException) -> tuple[str, int] | None:
    """A mistake the user can act on, as (one line, exit code); None for anything else (a bug: its traceback)."""
    if isinstance(exc, InterpolationResolutionError):  # an imgcls resolver refusing a value: its one line
        exc = exc.__cause__ or exc.__context__ or exc
    if isinstance(exc, UserError):
        return str(exc), exc.exit_code
    if isinstance(exc, MissingMandatoryValue):
        return f"{exc.full_key} must be set (e.g. {exc.full_key}=...)", 2
    if type(exc).__module__.startswith("wandb") and type(exc).__name__ == "UsageError":
        # wandb.init without credentials, from inside Lightning's fit: W&B's own reason, and the way without them
        return f"logger=wandb: {str(exc).strip()} Or log offline (logger.wandb.offline=true), then `wandb sync`", 2
    return None


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
    from imgcls.run.plan import world_size_of  # torch: only for a multirun

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
    "train": "imgcls.run.train:run",
    "benchmark": "imgcls.bench.training:run",
    "plan": "imgcls.run.plan:show",
}
EVALUATE_MODES: dict[str, str] = {"evaluate": "imgcls.run.evaluate:run", "benchmark": "imgcls.bench.inference:run"}


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
    check_config(cfg, table, warn=False)  # the table's mode choices are the keys of modes (tests/test_config_home.py)
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


# classify's paths given without a key (`python -m imgcls.classify CKPT IMAGE...`, as NVIDIA's classify.py and
# timm's inference.py take them): kept out of Hydra's grammar, where a path is no override, and set in the config.
CLASSIFY_PATHS: list[str] = []


@hydra.main(version_base="1.3", config_path="conf", config_name="classify")
def _classify(cfg: DictConfig) -> Any:
    route_library_logs()
    with_positional_paths(cfg, CLASSIFY_PATHS)
    result = guarded(_function("imgcls.classify:run"), cfg)
    if result and result.get("failed"):
        sys.exit(1)  # some images could not be read; they were reported by name, the others classified
    return result


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def _export(cfg: DictConfig) -> Any:
    route_library_logs()
    return guarded(_function("imgcls.export:run"), cfg)


def train_main() -> None:
    check_command_line("train", TRAIN)
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
    check_command_line("evaluate", EVALUATE)
    _evaluate()


def classify_main() -> None:
    # `--json` as well as Hydra's json=true: the flag scripts expect.
    sys.argv = [a if a != "--json" else "json=true" for a in sys.argv]
    command_line = overrides.override_args(sys.argv[1:])
    positional = [a for a in command_line[0] if overrides.is_positional(a)] if command_line else []
    CLASSIFY_PATHS[:] = positional
    sys.argv = [sys.argv[0], *(a for a in sys.argv[1:] if a not in positional)]
    check_command_line("classify")
    _classify()


def with_positional_paths(cfg: DictConfig, paths: list[str]) -> None:
    """CKPT IMAGE...: the first path is the checkpoint unless ckpt= names it; the others are images, after any of
    images=[...]."""
    paths = list(paths)
    if paths and cfg.get("ckpt") in (None, ""):
        cfg.ckpt = paths.pop(0)
    if paths:
        given = cfg.get("images")
        given = [] if given in (None, "") else list(given) if isinstance(given, ListConfig) else [given]
        cfg.images = [*map(str, given), *paths]


def export_main() -> None:
    check_command_line("export")
    _export()
