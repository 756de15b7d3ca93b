"""Which files under a folder were opened, by any thread of this process or another, counted by the kernel.

Hand-written over ctypes because the standard library has no inotify binding and a test must not depend on
a package for 40 lines. A byte counter (/proc/self/io's rchar) was tried first and was not exact: it also
counts what pytest-xdist's pipe and lazy imports read (about 25 extra 9 KB files' worth in one CI run)."""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

_IN_OPEN = 0x20
_IN_ISDIR = 0x40000000
_EVENT = struct.Struct("iIII")


class FileOpens:
    """Watches every folder under `root` (as they are now) for files being opened; `names()` lists them since
    the last call, one entry per open."""

    def __init__(self, root: Path) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._folders: dict[int, Path] = {}
        for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(folder), _IN_OPEN)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder}")
            self._folders[wd] = folder

    def names(self) -> list[Path]:
        opened: list[Path] = []
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return opened
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if not mask & _IN_ISDIR and name:
                    opened.append(self._folders[wd] / os.fsdecode(name))

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> FileOpens:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
