"""The checkpoint policy: where checkpoints live, how they are written, and which checkpoint a run may resume
from (the callbacks that save them: callbacks/checkpoint.py).

- RUN_DIR/checkpoints/last.ckpt: every epoch (optionally every K steps), and at the final step of a run cut
  short inside an epoch; `ckpt_path=last` resumes from it.
- RUN_DIR/checkpoints/best.ckpt: the best val top-1.
- RUN_DIR/checkpoints/epoch_NNNN.ckpt: with callbacks.checkpoint.keep_epochs=N, the newest N epochs (-1: all).
- Every save is atomic and fsynced (storage.write_atomic), so a kill never leaves a truncated last.ckpt.
- A restarted job (SLURM requeue, torchrun restart, submitit) resumes from its newest checkpoint by step, and no
  run writes a checkpoint of an earlier step over a later one (resume_checkpoint).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from imgcls.errors import CheckpointError, StorageError
from imgcls.models.weights import safe_torch_load, why_unreadable
from imgcls.storage import write_atomic

CHECKPOINT_DIR = "checkpoints"
EPOCH_FILENAME = "epoch_{epoch:04d}"  # callbacks.checkpoint.keep_epochs: epoch_0000.ckpt is the first epoch's


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR


def last_path(run_dir: str | Path) -> Path:
    """RUN_DIR/checkpoints/last.ckpt: what `ckpt_path=last`, preemption and a requeued job use."""
    return checkpoint_dir(run_dir) / "last.ckpt"


def best_path(run_dir: str | Path) -> Path:
    return checkpoint_dir(run_dir) / "best.ckpt"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, through storage.write_atomic (why: see storage.py)."""

    def __init__(self) -> None:
        super().__init__()
        self._written: set[Path] = set()  # files this process wrote: their steps only grow

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if "://" in str(path):  # s3://, gs://: object stores commit uploads atomically themselves
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        if path not in self._written and path.is_file():
            # The start checked the run dir (resume_checkpoint); this holds for any other way in.
            step, held = checkpoint.get("global_step"), checkpoint_step(path)
            if step is not None and held is not None and held > int(step):
                raise CheckpointError(
                    f"{path} holds step {held} and this run is at step {step}: not replaced by an earlier step; "
                    "resume with ckpt_path=last, or start over in a new run dir (hydra.run.dir=...)"
                )
        write_atomic(path, lambda tmp: torch.save(checkpoint, tmp), what="checkpoint", durable=True)
        self._written.add(path)


def resolve_ckpt_path(ckpt_path: str | None, run_dir: str | Path) -> str | None:
    """`last` means this run dir's checkpoints/last.ckpt; None when there is none yet (fresh start)."""
    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "last":
        last = last_path(run_dir)
        return str(last) if last.exists() else None
    return str(ckpt_path)


def requeue_checkpoints(run_dir: str | Path) -> list[Path]:
    """RUN_DIR/hpc_ckpt_N.ckpt: the checkpoints Preemption linked before the job was requeued (Lightning's name, which
    its own SLURM resume looks for)."""
    return [p for p in Path(run_dir).glob("hpc_ckpt_*.ckpt") if p.stem.removeprefix("hpc_ckpt_").isdigit()]


def checkpoint_step(path: str | Path) -> int | None:
    """The optimizer step a checkpoint file was saved at (its metadata only: mmap), None if it is not readable."""
    try:
        return int(safe_torch_load(Path(path), mmap=True)["global_step"])
    except Exception:  # noqa: BLE001 - unreadable or not a Lightning checkpoint: it holds no step to compare
        return None


def newest_checkpoint(run_dir: str | Path) -> tuple[str, int] | None:
    """The run's checkpoint with the highest step, whichever file it is in: last.ckpt (every save) or an hpc_ckpt_N
    (a requeue's link, which a later save of last.ckpt leaves behind)."""
    steps = [(step, str(path)) for path in [last_path(run_dir), *requeue_checkpoints(run_dir)]
             if path.is_file() and (step := checkpoint_step(path)) is not None]  # fmt: skip
    if not steps:
        return None
    step, path = max(steps, key=lambda s: (s[0], s[1].endswith("last.ckpt")))
    return path, step


def resume_checkpoint(ckpt_path: str | None, run_dir: str | Path, restarted_by: str | None) -> str | None:
    """The checkpoint this run resumes from, None for a fresh start: ckpt_path= when given (`last`: last.ckpt, or a
    fresh start while there is none); else, when the launcher restarted this job (a SLURM requeue, a torchrun
    restart, submitit) or a requeue left its hpc_ckpt_N here, the run's newest checkpoint by step. (Lightning's own
    SLURM resume would take the newest hpc_ckpt_N even when a later last.ckpt exists; the path is given to it.)

    Refuses, in one line before training, a run that would write checkpoints of earlier steps over this run dir's
    later ones: a fresh start in a run dir that holds a checkpoint past step 0, or a resume from an older checkpoint
    than it holds (its saves would replace the later last.ckpt), naming both and how to start over on purpose."""
    newest = newest_checkpoint(run_dir)  # each file's step read once, here
    if ckpt_path not in (None, "", "null"):
        resume = resolve_ckpt_path(ckpt_path, run_dir)
    elif restarted_by is not None or requeue_checkpoints(run_dir):
        resume = None if newest is None else newest[0]
    else:
        resume = None
    if newest is None or newest[1] == 0:
        return resume
    path, step = newest
    start = step if resume == path else (checkpoint_step(resume) or 0 if resume is not None else 0)
    if start < step:
        what = "starts at step 0" if resume is None else f"resumes from {resume} at step {start}"
        raise CheckpointError(
            f"run_dir={run_dir} holds {path} at step {step} and this run {what}: its checkpoints would replace a "
            "later one; resume it with ckpt_path=last, or start over in a new run dir (hydra.run.dir=...)"
        )
    return resume


# The recipe keys that shape the LR schedule. Lightning restores the schedule with the checkpoint (timm's
# schedulers keep their length and base LRs in their state), so a resume that changes one of them would not change
# the schedule: with more epochs the extra ones train at the schedule's final LR (0 for cosine).
SCHEDULE_KEYS = ("epochs", "warmup_epochs", "schedule", "end_lr", "lr_interval", "lr_per_256", "lr")


def check_resumable(ckpt_path: str, arch: str, classes: list[str], recipe: Mapping[str, Any] | None = None) -> None:
    """Refuse, in one line, a checkpoint of another architecture or class list before Lightning
    fails deep inside load_state_dict, and a recipe whose LR schedule differs from the one it restores."""
    path = Path(ckpt_path)
    if not path.is_file():
        raise CheckpointError(f"ckpt_path={ckpt_path} does not exist")
    try:  # mmap: only the small metadata is read, not the tensors; never code from the file (weights_only)
        blob = safe_torch_load(path, mmap=True)
        meta = blob.get("imgcls")
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise CheckpointError(f"ckpt_path={ckpt_path} is not a readable checkpoint ({why_unreadable(exc)})") from None
    if not meta:
        raise CheckpointError(f"ckpt_path={ckpt_path} is not an imgcls training checkpoint")
    if meta["arch"] != arch:
        raise CheckpointError(
            f"ckpt_path={ckpt_path} is for model {meta['arch']}, not {arch}; resume it with model.arch={meta['arch']} "
            f"(as model=... or model.arch= set it for that run)"
        )
    if list(meta["classes"]) != list(classes):
        raise CheckpointError(
            f"ckpt_path={ckpt_path} was trained on {len(meta['classes'])} classes that differ from data.root's "
            f"{len(classes)}; to fine-tune on new classes use model.weights={ckpt_path} instead"
        )
    if recipe is None:
        return
    saved = (blob.get("hyper_parameters") or {}).get("recipe") or {}
    for key in SCHEDULE_KEYS:
        if key in saved and key in recipe and saved[key] != recipe[key]:
            raise CheckpointError(
                f"recipe.{key}={recipe[key]} but ckpt_path={ckpt_path} trained with recipe.{key}={saved[key]}, and "
                f"the LR schedule resumes as that run built it (epochs past its end train at its final LR): keep "
                f"recipe.{key}={saved[key]} (trainer.max_epochs stops a run early), or train on from the weights "
                f"in a new run dir (model.weights={ckpt_path})"
            )


def check_writable(run_dir: str | Path) -> None:
    """Fail before training (one line) when the run dir cannot hold checkpoints, not hours later."""
    run_dir = Path(run_dir)
    try:
        checkpoint_dir(run_dir).mkdir(parents=True, exist_ok=True)
        # mkstemp (O_EXCL): the probe is always a new file of ours, never one that happens to share its name.
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=checkpoint_dir(run_dir))
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StorageError(f"run_dir={run_dir} is not writable ({exc.strerror or type(exc).__name__})") from None
