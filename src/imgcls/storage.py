"""Files imgcls writes: replaced atomically, never over a file of the user's, and checked writable up front.

One primitive, `write_atomic`, serves checkpoints, report/eval/benchmark JSON and exported models: write a
temp file in the destination's directory, then `os.replace` it over the destination, so that a reader (or a
kill, a full disk, an I/O error) sees the previous file or the complete new one, never a mix. The temp file
is made with O_EXCL (mkstemp): it can never be, or truncate, a file that happens to share its name, and it is
the only thing removed when the write fails.

Checkpoints are also fsynced (file and directory), because a resumed run depends on them. Lightning's own
`_atomic_save` (fabric/utilities/cloud_io.py, 2.6) stages the bytes in the system temp dir and commits with
`shutil.move`; with node-local /tmp and the run dir on NFS/Lustre (the usual cluster layout) that move is a
copy, so a kill during the copy left a truncated last.ckpt and a checkpoint-sized orphan in /tmp.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from imgcls.errors import StorageError

_UMASK = os.umask(0o022)  # read once, at import (setting it is the only way to read it), and put back
os.umask(_UMASK)


def readable_mode(directory: bool = False) -> int:
    """The mode a new file (or folder) of the user's gets: what mkstemp/mkdtemp's private 0600/0700 would have been
    under the user's umask."""
    return (0o777 if directory else 0o666) & ~_UMASK


def write_atomic(path: Path, write: Callable[[Path], object], what: str = "", durable: bool = False) -> None:
    """Write `path` via `write(temp_path)` and rename it into place. `what` names the file in errors
    ("checkpoint"). durable=True (checkpoints, always in RUN_DIR/checkpoints, a folder imgcls made) fsyncs
    the bytes and the rename, and reuses one temp name, `NAME.tmp`: a save killed mid-write (kill -9, OOM)
    then leaves one checkpoint-sized orphan that the next save overwrites, not one more per kill."""
    path = Path(path)
    label = f"{what} {path}" if what else str(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if durable:
            tmp = str(path.with_name(path.name + ".tmp"))
        else:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
    except OSError as exc:
        raise StorageError(f"could not write {label} ({exc.strerror or type(exc).__name__})") from None
    try:
        write(Path(tmp))
        os.chmod(tmp, readable_mode())  # mkstemp makes 0600; our files are as readable as any other
        if durable:
            _fsync(tmp, os.O_RDONLY)  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
        if durable:
            _fsync(path.parent, os.O_RDONLY)  # the rename itself survives a power loss
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # no half-written orphan; a full disk gets its space back
        if not isinstance(exc, (OSError, RuntimeError)):  # torch.save wraps some failures (EFBIG) in RuntimeError
            raise
        reason = (exc.strerror or type(exc).__name__) if isinstance(exc, OSError) else str(exc).splitlines()[0]
        kept = ""
        if what:
            kept = f"; the previous {what} is intact" if path.exists() else f"; no {what} was written"
        raise StorageError(f"could not write {label} ({reason}){kept}") from None


def _fsync(target: str | Path, flags: int) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory; the rename still holds
        fd = os.open(target, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_json_atomic(path: Path, document: Any) -> None:
    """report.json, eval.json, benchmark.json (PATH may be a user's `output=`)."""
    text = json.dumps(document, indent=2, sort_keys=False) + "\n"
    write_atomic(Path(path), lambda tmp: tmp.write_text(text))
