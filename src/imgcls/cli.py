"""Command-line entry points: where commands and their modes are chosen, with one-line errors and exit codes.

`train.py` / `evaluate.py` at the repository root, `python -m imgcls.classify` / `python -m imgcls.export`
and the `imgcls-*` console scripts all end up here. Nothing in imgcls imports this module.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from imgcls.config import overrides
from imgcls.config.checks import CLASSIFY, EVALUATE, EXPORT, TRAIN, Check, check_config
from imgcls.config.compose import compose_config, options
from imgcls.config.hardware import resolve_auto_hardware
from imgcls.config.nvidia_flags import nvidia_override
from imgcls.distributed import is_rank_zero
from imgcls.errors import ConfigError, UserError
from imgcls.redaction import redact_overrides, secrets_to_environment
from imgcls.run.log_setup import route_library_logs
from imgcls.run.rundir import discard_failed_run, launch_overrides, task_name
from imgcls.run.sweep_results import SWEEP_FAILURES  # each failed job's line and exit code (also in the results table)

# Nothing above imports torch, timm or Lightning: a command that ends with a one-line error (an unknown group
# choice, a bad value, a missing ckpt=) exits in about a second instead of importing them first (~6 s of CPU).
# The modules that do the work are imported by name once the config has passed its checks (`_function`).

log = logging.getLogger("imgcls")


def check_command_line(config_name: str, table: dict[str, Check] | None = None) -> None:
    """sys.argv's overrides checked before Hydra runs (imgcls.config.overrides): a mistake is one line, exit code 2.
    Then the credentials typed there leave sys.argv for the environment, before Hydra, W&B or a DDP launcher
    records sys.argv (imgcls.redaction.secrets_to_environment)."""
    show_help(config_name, sys.argv[1:])
    try:
        refuse_flags(config_name, sys.argv[1:], table)
        overrides.check_command_line(config_name, sys.argv[1:], table)
    except UserError as exc:
        fail(str(exc), exc.exit_code)
    sys.argv[1:] = secrets_to_environment(sys.argv[1:])


def refuse_flags(config_name: str, argv: list[str], table: dict[str, Check] | None = None) -> None:
    """`--topk 3`, `--topk=3`, `--use-ema` (timm's and NVIDIA's argparse style) are KEY=VALUE overrides here: one
    line with the override to type: the key of that name, of that dotted name (--data-backend: data.backend), the
    group the value is an option of (--arch resnet50: model=resnet50) or the key whose last part the name is
    (--epochs: recipe.epochs), else the command line's did-you-mean."""
    hydra_flags = get_args_parser()._option_string_actions  # Hydra's own (--help, -m, --cfg, ...): Hydra's affair
    for index, arg in enumerate(argv):
        if not arg.startswith("-") or arg == "-" or arg.split("=", 1)[0] in hydra_flags or _is_number(arg):
            continue
        name, given, value = arg.lstrip("-").split("=", 1)[0].replace("-", "_"), arg, "true"  # a switch: --use-ema
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif index + 1 < len(argv) and not argv[index + 1].startswith("-") and "=" not in argv[index + 1]:
            value = argv[index + 1]
            given = f"{arg} {value}"
        if config_name == "train" and (nvidia := nvidia_override(name, value)) is not None:
            raise ConfigError(f"{given}: options are KEY=VALUE overrides, not --flags; use {nvidia}")
        keys = _keys(compose_config(config_name, []))
        named = [k for k in (name, name.replace("_", ".", 1)) if k in keys or k in COMMAND_GROUPS[config_name]]
        named += [g for g in COMMAND_GROUPS[config_name] if value in options(g)]  # --arch resnet50: model=resnet50
        named += [k for k in keys if k.rsplit(".", 1)[-1] == name]
        if named:
            instead = f"use {named[0]}={value}"
        else:
            try:
                overrides.check_command_line(config_name, [f"{name}={value}"], table)
                instead = f"use {name}={value}"
            except UserError as exc:  # the key it likely is, or the keys there are
                meant = str(exc).rsplit("did you mean ", 1)
                instead = f"use {meant[1].rstrip('?')}" if len(meant) == 2 else str(exc)
        raise ConfigError(f"{given}: options are KEY=VALUE overrides, not --flags; {instead}")


def _keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Every key of cfg, mappings and leaves, in the config's order (nothing resolved)."""
    found: list[str] = []
    for name in map(str, cfg.keys()):
        node = cfg._get_node(name)
        found.append(prefix + name)
        if isinstance(node, DictConfig) and not node._is_none():
            found += _keys(node, f"{prefix}{name}.")
    return found


def _is_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True


# The first lines of each command's --help: how to call it and its main keys (its groups and keys follow).
USAGE: dict[str, str] = {
    "train": """usage: python train.py [GROUP=OPTION ...] [KEY=VALUE ...]
  python train.py experiment=demo                                  # handwritten digits on the CPU, minutes
  python train.py model=resnet50 precision=amp data.root=DIR       # DIR/train/<class>/*.jpg and DIR/val/...
  python train.py experiment=resnet50_dgxa100_amp_90e data.root=DIR  # one of NVIDIA's published runs
  python train.py mode=plan experiment=resnet50_dgxa100_amp_90e    # the resolved batch, LR and steps; no data
  python train.py hydra.run.dir=RUN ckpt_path=last                 # resume the run in RUN
main keys: data.root, model, precision, hardware, recipe, recipe.epochs, data.batch_size, trainer.devices, seed""",
    "evaluate": """usage: python evaluate.py ckpt=PATH data.root=DIR [KEY=VALUE ...]
  python evaluate.py ckpt=RUN/checkpoints/best.ckpt data.root=DIR  # val top-1/top-5/loss -> RUN_DIR/eval.json
  python evaluate.py ckpt=weights.pth model=resnet50 data.root=DIR # a timm / torchvision state_dict
  python evaluate.py ckpt=model_int8.onnx data.root=DIR            # an ONNX export, on ONNX Runtime
  python evaluate.py mode=benchmark ckpt=PATH batch_sizes=[1,32]   # latency and throughput
main keys: ckpt, data.root, use_ema, precision, data.batch_size, output""",
    "classify": """usage: python -m imgcls.classify CKPT IMAGE_OR_DIR... [KEY=VALUE ...]
  python -m imgcls.classify RUN/checkpoints/best.ckpt a.jpg photos/  # the top-5 classes of each image
  python -m imgcls.classify ckpt=weights.pth model=resnet50 images=[a.jpg] --json
main keys: ckpt, images, topk, batch_size, backend (auto|torch|onnx), use_ema, json""",
    "export": """usage: python -m imgcls.export ckpt=PATH format=weights|onnx|torchscript|int8|triton [KEY=VALUE ...]
  python -m imgcls.export ckpt=RUN/checkpoints/best.ckpt format=onnx   # writes RUN/checkpoints/best.onnx
  python -m imgcls.export ckpt=best.ckpt format=int8 data.root=DIR    # INT8 Q/DQ ONNX, calibrated on DIR/train
  python -m imgcls.export ckpt=best.ckpt format=triton repo=DIR       # a Triton model repository
main keys: ckpt, format, output, use_ema, opset, data.root, repo""",
}


def show_help(config_name: str, argv: list[str]) -> None:
    """--help / -h: the command's usage, its config groups (the options a user picks: not the `_` bases) and its
    keys with their defaults; exit 0. Hydra's own help lists every group of conf/ with its internal files."""
    if not any(a in ("--help", "-h") for a in argv):
        return
    composed = compose_config(config_name, [])
    lines = [
        USAGE[config_name],
        "",
        "Arguments are KEY=VALUE overrides (no --flags); GROUP=OPTION picks a group's file.",
    ]
    lines += ["", "Config groups (GROUP=OPTION):"]
    lines += [f"  {group}: {', '.join(options(group))}" for group in COMMAND_GROUPS[config_name]]
    lines += ["", "Keys and their defaults (KEY=VALUE):"]
    lines += ["  " + line for line in OmegaConf.to_yaml(composed, resolve=False).splitlines()]
    lines += ["", "Hydra's own options: --hydra-help, --cfg job (the composed config), -m (a sweep over values)"]
    print("\n".join(lines))
    sys.exit(0)


# The config groups of each command (train.yaml's defaults list; the others' optional `model: null`, ...).
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "train": overrides.GROUPS,
    "evaluate": ("model", "precision"),
    "classify": ("model",),
    "export": ("model",),
}


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
            _discard_failed_run(cfg)
            fail(message, code)
        job = f"job {HydraConfig.get().job.num} ({','.join(redact_overrides(_varying_overrides()))})"
        log.error("%s failed: %s", job, message)
        SWEEP_FAILURES.append((f"{job}: {message}", code))
        return None
    finally:
        _finish_wandb()


def _discard_failed_run(cfg: DictConfig) -> None:
    """The run dir Hydra made for a run that failed before its work (run/rundir.py discard_failed_run), on the rank
    that writes it; nothing where the command has no run dir of its own (classify, export: the current dir)."""
    if not HydraConfig.initialized() or not is_rank_zero() or HydraConfig.get().output_subdir is None:
        return
    try:
        discard_failed_run(HydraConfig.get().runtime.output_dir, str(cfg.get("task_name")))
    except OSError:  # the error line matters more than the tidying
        pass


def user_error(exc: BaseException) -> tuple[str, int] | None:
    """A mistake the user can act on, as (one line, exit code); None for anything else (a bug: its traceback)."""
    # An imgcls resolver refusing a value: its one line. OmegaConf wraps the resolver's error once on `cfg.get(key)`
    # and twice on attribute access (`cfg.key` re-raises its own error with the first as the cause).
    while isinstance(exc, InterpolationResolutionError) and (inner := exc.__cause__ or exc.__context__) is not None:
        exc = inner
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
    starts each job as its own cluster job (submitit) is fine, and so is a sweep of plans (mode=plan starts no
    process)."""
    if not _in_multirun() or "submitit" in str(HydraConfig.get().launcher.get("_target_", "")):
        return
    if cfg.get("mode") == "plan":
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
    result = guarded(lambda c: _checked_run("imgcls.classify:run", c, CLASSIFY), cfg)
    if result and result.get("failed"):
        sys.exit(1)  # some images could not be read; they were reported by name, the others classified
    return result


@hydra.main(version_base="1.3", config_path="conf", config_name="export")
def _export(cfg: DictConfig) -> Any:
    route_library_logs()
    return guarded(lambda c: _checked_run("imgcls.export:run", c, EXPORT), cfg)


def _checked_run(target: str, cfg: DictConfig, table: dict[str, Check]) -> Any:
    """A command without modes: its keys checked as train.py's are (one line, before torch is imported), then run."""
    check_config(cfg, table, warn=False)
    return _function(target)(cfg)


def interruptible(main: Callable[[], None]) -> Callable[[], None]:
    """Ctrl-C where no run is saving (start-up, evaluate, classify, export): one line and exit 130 (128 + SIGINT, as
    a shell reports it), never a traceback. During training imgcls's own handler saves first
    (callbacks/preemption.py); a KeyboardInterrupt reaches here only outside it."""

    @functools.wraps(main)
    def wrapped() -> None:
        try:
            main()
        except KeyboardInterrupt:
            fail("interrupted (Ctrl-C) before anything was saved", 128 + signal.SIGINT)

    return wrapped


@interruptible
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


@interruptible
def evaluate_main() -> None:
    check_command_line("evaluate", EVALUATE)
    _evaluate()


@interruptible
def classify_main() -> None:
    # `--json` as well as Hydra's json=true: the flag scripts expect.
    sys.argv = [a if a != "--json" else "json=true" for a in sys.argv]
    show_help("classify", sys.argv[1:])
    try:  # before the paths without a key are taken: the 3 of `--topk 3` is no image
        refuse_flags("classify", sys.argv[1:])
    except UserError as exc:
        fail(str(exc), exc.exit_code)
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


@interruptible
def export_main() -> None:
    check_command_line("export")
    _export()
