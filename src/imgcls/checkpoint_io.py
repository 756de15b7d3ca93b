"""Crash-safe checkpoint files: write `NAME.tmp` in the same directory, fsync, then rename.

Lightning's `_atomic_save` (fabric/utilities/cloud_io.py, 2.6) writes through an fsspec transaction. For
local paths fsspec stages the bytes in `tempfile.mkstemp()` - the system temp dir, not the checkpoint's
directory - and commits with `shutil.move`. When /tmp and the run dir are different filesystems (node-local
/tmp, run dir on NFS/Lustre: the usual cluster layout) that move is a copy, so a kill during the copy leaves
a truncated last.ckpt; nothing is fsynced, and a killed save leaves a checkpoint-sized orphan in /tmp.
`os.replace` within one directory is atomic on POSIX: a reader sees the old file or the new one, never a
mix. Remote (fsspec URL) paths keep Lightning's behaviour.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from imgcls.errors import StorageError


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if "://" in str(path):  # s3://, gs://: object stores commit uploads atomically themselves
            return super().save_checkpoint(checkpoint, path, storage_options)
        write_atomic(Path(path), lambda f: torch.save(checkpoint, f))


def write_atomic(path: Path, write: Any) -> None:
    """Write `path` via `write(file)` so that a kill, a full disk or an I/O error at any moment leaves
    either the previous file or the complete new one. Errors become one-line StorageErrors."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
        _fsync_dir(path.parent)  # the rename itself survives a power loss
    except (OSError, RuntimeError) as exc:  # torch.save wraps some write failures (EFBIG) in RuntimeError
        with contextlib.suppress(OSError):
            tmp.unlink()  # no half-written orphan; a full disk gets its space back
        if isinstance(exc, OSError):
            reason = exc.strerror or type(exc).__name__
        else:
            reason = str(exc).splitlines()[0]
        kept = "the previous checkpoint is intact" if path.exists() else "no checkpoint was written"
        raise StorageError(f"could not write checkpoint {path} ({reason}); {kept}") from None


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot open/fsync a directory; the rename still holds
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_writable(run_dir: str | Path) -> None:
    """Fail before training (one line) when the run dir cannot hold checkpoints, not hours later."""
    run_dir = Path(run_dir)
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        # mkstemp (O_EXCL): the probe is always a new file of ours, never one that happens to share its name.
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=run_dir / "checkpoints")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StorageError(f"run_dir={run_dir} is not writable ({exc.strerror or type(exc).__name__})") from None
