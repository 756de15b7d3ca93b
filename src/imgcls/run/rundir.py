"""One run dir for all ranks, fixed before Hydra starts (design notes: "One run dir for all ranks").

Lightning's own launcher re-executes ranks >= 1 with rank 0's `hydra.run.dir` and
`hydra.output_subdir=null`. torchrun and srun start every process themselves, so each would resolve
`${now:}` on its own clock and make its own dir. The entry point therefore derives the dir from the
launch's id (the same string on every rank and node) and keeps ranks other than 0 from writing Hydra's
files. Hand-written because neither Hydra nor Lightning does this for external launchers (hydra #2070).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from imgcls.config.hardware import INTERACTIVE_JOBS
from imgcls.errors import ConfigError

# Keeps mode=plan from writing .hydra/ and the log file (console logging stays). Ranks other than 0 write neither
# on any launcher through the config itself (conf/hydra/default.yaml's ${imgcls.rank_zero:...}).
NO_HYDRA_FILES = (
    "hydra.output_subdir=null",
    "hydra.job_logging.root.handlers=[console]",
    "~hydra.job_logging.handlers.file",
)


def launch_id(env: Mapping[str, str] | None = None) -> str | None:
    """The id shared by every process of an external multi-process launch, or None if not launched so.

    torchrun: its rendezvous id (`--rdzv-id`, a fresh uuid with `--standalone`); a SLURM batch job, with one
    task or several: the job id, which a requeued job keeps, so that it finds its checkpoints (Lightning's
    hpc_ckpt, `ckpt_path=last`). An interactive allocation (job name bash or interactive, as Lightning's
    SLURMEnvironment tells them apart) keeps the timestamped dir: each command in it is a new run."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env:
        # One process too: torchrun --max-restarts restarts it with the same id, and it must find its checkpoints.
        run_id = env["TORCHELASTIC_RUN_ID"]
        if run_id == "none" and int(env.get("WORLD_SIZE") or 1) == 1:
            return None  # torchrun's default static rendezvous has no id; alone, nothing to share a dir with
        if run_id == "none":
            raise ConfigError(
                "under torchrun the ranks need a shared run dir: pass hydra.run.dir=DIR, or give torchrun "
                "--rdzv-id=ID (or --standalone on one node)"
            )
        return run_id
    if env.get("SLURM_JOB_ID") and env.get("SLURM_NTASKS") and env.get("SLURM_JOB_NAME") not in INTERACTIVE_JOBS:
        return env["SLURM_JOB_ID"]
    return None


def launch_overrides(argv: Sequence[str], task: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Hydra overrides to append to argv: the run dir shared by the launch's ranks; mode=plan without a
    hydra.run.dir=: no run dir at all."""
    if any(a in ("-m", "--multirun") for a in argv):
        return []  # a sweep's jobs get their dirs from hydra.sweep.dir, composed once by the launcher
    run_dir_given = any(a.startswith("hydra.run.dir=") for a in argv)
    if mode_of(argv) == "plan" and not run_dir_given:
        # A plan reads the config and prints; Hydra would still make outputs/TASK/TIME with .hydra/ and a log
        # file in it. The current dir (which exists) as the run dir, and no Hydra files: nothing is written.
        return ["hydra.run.dir=.", *(o for o in NO_HYDRA_FILES if o not in argv)]
    extra: list[str] = []
    run_id = None if run_dir_given else launch_id(env)
    if run_id is not None:
        extra.append(f"hydra.run.dir=outputs/{task}/{run_id}")
    return extra


def mode_of(argv: Sequence[str]) -> str | None:
    """The mode= of a command line (the last one wins, as in Hydra), or None when it sets none."""
    modes = [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith("mode=")]
    return modes[-1] if modes else None


def task_name(argv: Sequence[str], default: str) -> str:
    return next((a.split("=", 1)[1] for a in argv if a.startswith("task_name=")), default)


def _is_run_config(path: Path) -> bool:
    from omegaconf import DictConfig, OmegaConf

    try:
        cfg = OmegaConf.load(path)
    except Exception:  # noqa: BLE001 - anything unreadable as YAML is not ours
        return False
    return isinstance(cfg, DictConfig) and all(k in cfg for k in ("model", "recipe", "trainer"))


def _is_report(path: Path) -> bool:
    try:
        return "epochs" in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        return False


# The files train.py writes at fixed names at the top of the run dir, and how to recognise its own.
RUN_FILES = {"config.yaml": _is_run_config, "report.json": _is_report}


def check_run_files_are_ours(run_dir: str | Path) -> None:
    """A run dir may be any folder (hydra.run.dir=.): refuse, before anything is written, to replace a
    config.yaml or report.json that an imgcls run did not write."""
    for name, ours in RUN_FILES.items():
        path = Path(run_dir) / name
        if os.path.lexists(path) and not (path.is_file() and ours(path)):
            raise ConfigError(
                f"run_dir={run_dir} holds a {name} that imgcls did not write; choose another hydra.run.dir"
            )


# What Hydra writes into a run dir before the task starts (rank 0: conf/hydra/default.yaml), besides TASK.log.
HYDRA_ENTRIES = {".hydra", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"}


def made_by_hydra_for(run_dir: str | Path, task: str) -> bool:
    """Whether run_dir holds nothing but what Hydra wrote when this command started (.hydra/ and TASK.log): a run
    that fails now never got to its work (train.py writes config.yaml before its first step, evaluate eval.json at
    its end). A resumed run's dir (checkpoints, config.yaml), a logger's files and hydra.run.dir=. (the user's own
    files; the current dir) are not."""
    run_dir = Path(run_dir)
    if run_dir.is_symlink() or not (run_dir / ".hydra").is_dir() or run_dir.resolve() == Path.cwd().resolve():
        return False
    entries = {path.relative_to(run_dir).as_posix() for path in run_dir.rglob("*")}
    return entries <= HYDRA_ENTRIES | {f"{task}.log"}


def remove_run_dir(run_dir: str | Path) -> bool:
    """Remove a failed run's dir (the caller decided it is the run's own: made_by_hydra_for), and the folders of
    Hydra's default tree above it (./outputs/TASK/, ./outputs/: conf/hydra/default.yaml) that it leaves empty: a dozen
    mistakes should not leave a dozen dirs. A folder outside ./outputs/ (hydra.run.dir=mine/run: the user's own
    `mine/`) is never removed, even when empty.
    Its log file's handler (Hydra's, on the root logger) is closed first: a later record would reopen the file in a
    removed dir. True when removed."""
    run_dir = Path(run_dir)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).is_relative_to(run_dir.resolve()):
            handler.close()
            root.removeHandler(handler)
    shutil.rmtree(run_dir, ignore_errors=True)
    outputs, parent = Path.cwd().resolve() / "outputs", run_dir.resolve().parent
    while parent.is_relative_to(outputs):
        try:
            parent.rmdir()
        except OSError:  # not empty: other runs are in it
            break
        parent = parent.parent
    return not run_dir.exists()


def discard_failed_run(run_dir: str | Path, task: str) -> bool:
    """After a user error, the run dir Hydra made for this command, if it holds nothing else. True when removed."""
    return made_by_hydra_for(run_dir, task) and remove_run_dir(run_dir)
