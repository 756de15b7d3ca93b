"""Files imgcls writes: replaced atomically, never over a file of the user's, and checked writable up front.

One primitive, `write_atomic`, serves checkpoints, report/eval/benchmark JSON and exported models: write a
temp file in the destination's directory, then `os.replace` it over the destination, so that a reader (or a
kill, a full disk, an I/O error) sees the previous file or the complete new one, never a mix. The temp file
is made with O_EXCL (mkstemp): it can never be, or truncate, a file that happens to share its name, or a link
someone planted, and it is the only thing removed when the write fails (a checkpoint save also removes the temps
that killed saves of that checkpoint left).

Checkpoints are also fsynced (file and directory), because a resumed run depends on them. Lightning's own
`_atomic_save` (fabric/utilities/cloud_io.py, 2.6) stages the bytes in the system temp dir and commits with
`shutil.move`; with node-local /tmp and the run dir on NFS/Lustre (the usual cluster layout) that move is a
copy, so a kill during the copy left a truncated last.ckpt and a checkpoint-sized orphan in /tmp.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
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


def temp_prefix(path: Path) -> str:
    """The name of `path`'s temp files up to mkstemp's 8 random characters: `.NAME.imgcls.XXXXXXXX.tmp`. Hidden,
    and marked as imgcls's, so that a durable save can tell a temp of its own left by a kill from a user's file.
    (cache.py's prune, whose pattern is `.NAME.XXXXXXXX.tmp`, matches them too.)"""
    return f".{path.name}.imgcls."


def write_atomic(path: Path, write: Callable[[Path], object], what: str = "", durable: bool = False) -> None:
    """Write `path` via `write(temp_path)` and rename it into place. `what` names the file in errors
    ("checkpoint"). durable=True (checkpoints) fsyncs the bytes and the rename, and first removes the temps of
    `path` that a save killed mid-write (kill -9, OOM) left: one checkpoint-sized orphan at most, not one more
    per kill.

    The temp's name is random and made with O_EXCL (mkstemp), never a fixed one: a link planted at a name the
    next save will use (`last.ckpt.tmp -> ~/notes.txt` was) would redirect the write and the chmod to the
    link's target. The mode and the fsync go through the descriptor mkstemp opened, and the name must still be
    that file when it is renamed into place."""
    path = Path(path)
    label = f"{what} {path}" if what else str(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if durable:
            _remove_stale_temps(path)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise StorageError(f"could not write {label} ({exc.strerror or type(exc).__name__})") from None
    try:
        try:
            write(Path(tmp))
            made = os.fstat(fd)
            now = os.lstat(tmp)
            if (now.st_dev, now.st_ino) != (made.st_dev, made.st_ino):
                # Something replaced the temp while it was written; what is there now is not ours to publish.
                raise OSError(errno.EEXIST, f"{tmp} was replaced while being written")
            os.fchmod(fd, readable_mode())  # mkstemp makes 0600; our files are as readable as any other
            if durable:
                os.fsync(fd)  # the bytes are on disk before the name points at them
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if durable:
            _fsync(path.parent, os.O_RDONLY)  # the rename itself survives a power loss
    except BaseException as exc:
        with contextlib.suppress(OSError):
            if _is_our_file(os.lstat(tmp)):
                os.unlink(tmp)  # no half-written orphan; a full disk gets its space back
        if not isinstance(exc, (OSError, RuntimeError)):  # torch.save wraps some failures (EFBIG) in RuntimeError
            raise
        reason = (exc.strerror or type(exc).__name__) if isinstance(exc, OSError) else str(exc).splitlines()[0]
        kept = ""
        if what:
            kept = f"; the previous {what} is intact" if path.exists() else f"; no {what} was written"
        raise StorageError(f"could not write {label} ({reason}){kept}") from None


def _is_our_file(info: os.stat_result) -> bool:
    """A regular file of this user's: never a link (unlinking one is harmless, but it is not ours to remove)."""
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()


def _remove_stale_temps(path: Path) -> None:
    """Remove the temps of `path` (temp_prefix's names, regular files of ours) left by killed saves."""
    pattern = re.compile(re.escape(temp_prefix(path)) + r"[a-z0-9_]{8}\.tmp")
    with os.scandir(path.parent) as entries:
        for entry in entries:
            if pattern.fullmatch(entry.name):
                with contextlib.suppress(OSError):
                    if _is_our_file(entry.stat(follow_symlinks=False)):
                        os.unlink(entry.path)


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
