"""The checkpoint policy: RUN_DIR/checkpoints/last.ckpt and best.ckpt (best val top-1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint


def checkpoint_callbacks(cfg: Any, run_dir: str | Path, has_val: bool = True) -> list[ModelCheckpoint]:
    """`last.ckpt` every epoch (and every K steps if asked), `best.ckpt` on the monitored metric."""
    if cfg is None:
        return []
    dirpath = Path(run_dir) / "checkpoints"
    callbacks = []
    if has_val and cfg.get("monitor"):
        callbacks.append(
            ModelCheckpoint(
                dirpath=dirpath,
                filename="best",
                monitor=cfg.monitor,
                mode="max",
                save_top_k=1,
                save_last=True,
                every_n_epochs=int(cfg.get("every_n_epochs") or 1),
                enable_version_counter=False,
                auto_insert_metric_name=False,
            )
        )
    else:
        callbacks.append(ModelCheckpoint(dirpath=dirpath, save_top_k=0, save_last=True, enable_version_counter=False))
    if cfg.get("every_n_train_steps"):
        callbacks.append(
            ModelCheckpoint(
                dirpath=dirpath,
                save_top_k=0,
                save_last=True,
                every_n_train_steps=int(cfg.every_n_train_steps),
                enable_version_counter=False,
            )
        )
    return callbacks


def resolve_ckpt_path(ckpt_path: str | None, run_dir: str | Path) -> str | None:
    """`last` means this run dir's checkpoints/last.ckpt; None when there is none yet (fresh start)."""
    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "last":
        last = Path(run_dir) / "checkpoints" / "last.ckpt"
        return str(last) if last.exists() else None
    return str(ckpt_path)
