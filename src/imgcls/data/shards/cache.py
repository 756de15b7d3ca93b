"""data.shard_cache: the one module that knows what imgcls keeps there and where, and that lists and prunes it.

Layout (CACHE = data.shard_cache; default $IMGCLS_CACHE/shards, else $HOME/.cache/imgcls/shards, as
conf/data/_base.yaml defines it):

    CACHE/CACHEDIR.TAG                               marks CACHE as a cache (the Cache Directory Tagging
                                                     convention: backup tools skip it); written only in a
                                                     folder that imgcls creates or finds empty
    CACHE/imgcls-files.jsonl                         the index: one line per file imgcls creates in CACHE,
                                                     appended before the file is made
    CACHE/remote/<scheme>/<bucket-or-host>/<path>    a copy of a shard URL (remote.local_copy); a signed
                                                     https URL's query adds -<hash> to the file name; the
                                                     host is hostname[:port], never a URL's user:password
    CACHE/remote/pipe/<hash of CMD>/<name>           the stdout of pipe:CMD, named by the command's last file
    CACHE/dali_idx/<hash of path, size, mtime>/NAME.idx   a DALI index file made for a TFRecord shard
                                                     without one (tfrecord.dali_index_files)
    CACHE/counts/<hash of path>-NAME.json            a shard's record count from a scan of its headers,
                                                     with the path, size and mtime it holds for (manifest.py)

Beside a remote copy: `.NAME.meta.json` (the copy's inode and size and the object's ETag or checksum when
the store gives one: a reused copy must still be that object), `.NAME.lock` (remote.py's flock: one download
per file across ranks and workers) and, while it downloads, `.NAME.XXXXXXXX.part`; `.NAME.XXXXXXXX.tmp`
beside a file written whole (write_file; storage.write_atomic's for DALI index files).

Why an index as well as a tag: a tag marks a folder, not its files. A user's file put later into a tagged
folder (CACHE/remote/backup/2024/thesis.tex sits where a copy would) was pruned as one. Prune deletes a file
only when CACHE holds imgcls's tag AND the index names the file AND it is a regular file at a place of the
layout, reached without following a symbolic link. Whatever else is in CACHE is listed as not imgcls's.

Last use: the later of a file's atime and mtime. The writers mark an entry they reuse (`used`: the atime
set to now, the mtime kept, since the index and count keys hold a copy's mtime), so least-recently-used
holds on noatime mounts too.

`python -m imgcls.data.shards cache [list]` counts each kind; `cache prune --max-size SIZE` and/or
`--older-than DAYS` removes entries least recently used first, deletes a remote copy only while holding
its lock (a download in progress keeps it), and deletes an in-flight file only when it is older than
TEMP_GRACE_S and, for a download, unlocked. Folders are left in place (a writer may be about to use one).
docs/shards.md "The cache".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shlex
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from imgcls.errors import ConfigError, DataError
from imgcls.redaction import redact_url
from imgcls.storage import readable_mode

REMOTE, DALI_IDX, COUNTS = "remote", "dali_idx", "counts"
KINDS = (REMOTE, DALI_IDX, COUNTS)
IN_FLIGHT = "in flight"
META = ".meta.json"  # the kind of a copy's record, and its name's ending
TAG = "CACHEDIR.TAG"
INDEX = "imgcls-files.jsonl"
TAG_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"  # bford.info/cachedir
TAG_OWNER = "# data.shard_cache of imgcls"
TAG_TEXT = (
    f"{TAG_SIGNATURE}\n{TAG_OWNER}: remote shard copies, DALI index files, record counts.\n"
    "# Made again when needed; `python -m imgcls.data.shards cache prune` trims it.\n"
)
PIPE = "pipe:"
PART = ".part"
TEMP_GRACE_S = 30 * 60  # an in-flight file untouched this long belongs to a process that is gone

_HASH = re.compile(r"[0-9a-f]{16}")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_TEMP = re.compile(r"\.(.+)\.[a-z0-9_]{8}\.(part|tmp)")  # 8 random characters (download_temp's, mkstemp's)
_SIDE = re.compile(r"\.(.+)(\.lock|\.meta\.json)")  # beside a remote copy: its lock, its record
_marked: set[str] = set()


def default_dir() -> str:
    """conf/data/_base.yaml's data.shard_cache: ${oc.env:IMGCLS_CACHE,${oc.env:HOME,/tmp}/.cache/imgcls}/shards."""
    base = os.environ.get("IMGCLS_CACHE") or f"{os.environ.get('HOME') or '/tmp'}/.cache/imgcls"
    return f"{base}/shards"


# --- where each kind of thing goes (the writers' side) ------------------------------------------------------


def copy_path(cache_dir: str, url: str) -> str:
    """Where remote.local_copy keeps `url`: CACHE/remote/<scheme>/<host[:port] or bucket>/<path>; pipe:CMD under
    CACHE/remote/pipe/<hash of CMD>/<the command's last file name>."""
    if url.startswith(PIPE):
        command = url[len(PIPE) :]
        try:
            words = shlex.split(command)
        except ValueError:  # unbalanced quotes: the shell will say so when it runs
            words = command.split()
        # the file the command fetches: its last path-like word (`aws s3 cp s3://b/x.tar -` ends in "-")
        paths = [w for w in words if not w.startswith("-") and ("/" in w or "." in w)]
        name = os.path.basename(urlsplit(paths[-1]).path) if paths else ""
        parts = ["pipe", hashlib.sha256(command.encode()).hexdigest()[:16], name or "stdout"]
    else:
        split = urlsplit(url)
        try:
            port = split.port
        except ValueError:
            port = None
        # hostname, not netloc: a URL's user:password must not become a folder name that every `ls` shows
        host = (split.hostname or "") + (f":{port}" if port is not None else "")
        parts = [split.scheme.lower(), host, *split.path.split("/")]
        if split.query:  # a signed https URL: same object, other query -> its own file
            parts[-1] += "-" + hashlib.sha256(split.query.encode()).hexdigest()[:12]
    parts = [p for p in parts if p]
    if any(p in (".", "..") or os.sep in p for p in parts) or len(parts) < 3 or not _SCHEME.fullmatch(parts[0]):
        raise DataError(f"cannot cache {redact_url(url)}: not a file URL (a '..' or '.' segment, or no file name)")
    return os.path.join(_root(cache_dir), REMOTE, *parts)


def index_path(cache_dir: str, shard: str, info: os.stat_result) -> Path:
    """Where tfrecord.dali_index_files makes the index of the local TFRecord file `shard` (stat `info`):
    CACHE/dali_idx/<hash of its real path, size and mtime>/NAME.idx (a changed file gets a new index).
    Entered in CACHE's index when it is not there yet: the caller is about to make it."""
    key = f"{os.path.realpath(shard)}\0{info.st_size}\0{info.st_mtime_ns}"
    path = Path(_root(cache_dir)) / DALI_IDX / _digest(key) / f"{os.path.basename(shard)}.idx"
    if not os.path.lexists(path):
        record(cache_dir, path)
    return path


def count_path(cache_dir: str, shard: str) -> Path:
    """Where manifest.py keeps the scanned record count of the local shard file `shard`:
    CACHE/counts/<hash of its real path>-NAME.json (the JSON holds the size and mtime it is valid for)."""
    return Path(_root(cache_dir)) / COUNTS / f"{_digest(os.path.realpath(shard))}-{os.path.basename(shard)}.json"


def lock_path(target: str) -> str:
    """The lock file of a remote copy: .NAME.lock beside it."""
    return os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.lock")


def meta_path(target: str) -> str:
    """The record of a remote copy: .NAME.meta.json beside it."""
    return os.path.join(os.path.dirname(target), f".{os.path.basename(target)}{META}")


def record(cache_dir: str, path: str | Path) -> None:
    """Enter `path` (a file in CACHE that imgcls is about to create) in CACHE's index, the list prune deletes
    from. Entered before the file exists, so that a kill between the two leaves nothing unlisted; an entry
    whose file never came is dropped by the next prune after TEMP_GRACE_S."""
    root = _root(cache_dir)
    relative = os.path.relpath(os.path.abspath(path), root)
    line = json.dumps({"path": relative, "time": round(time.time(), 3)}) + "\n"
    with contextlib.suppress(OSError):  # a read-only cache: the write of the file itself says why it fails
        fd = os.open(os.path.join(root, INDEX), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # prune rewrites the index under the same lock
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def open_lock(cache_dir: str, target: str) -> int:
    """remote.py's lock file of `target`, opened (made if missing, never through a symbolic link)."""
    path = lock_path(target)
    if not os.path.lexists(path):
        record(cache_dir, path)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)


def download_temp(cache_dir: str, target: str, suffix: str = PART) -> tuple[int, str]:
    """A new, empty temp file for `target` (.NAME.XXXXXXXX.part beside it), renamed over `target` when
    complete: (its descriptor, open for writing, and its path). Made with O_EXCL and O_NOFOLLOW under a random
    name, entered in CACHE's index first: a file or link already at the name is never written through."""
    folder, name = os.path.dirname(target), os.path.basename(target)
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(4)}{suffix}")
        record(cache_dir, tmp)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            return os.open(tmp, flags, readable_mode()), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temp name beside {target}")


def write_file(cache_dir: str, path: str | Path, text: str) -> None:
    """`text` as `path` in CACHE, whole (a temp renamed into place), the temp and the file in the index."""
    path = str(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.lexists(path):
        record(cache_dir, path)
    fd, tmp = download_temp(cache_dir, path, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_meta(cache_dir: str, target: str, fd: int, etag: str | None, url: str) -> None:
    """Record, beside where the file open as `fd` is about to become `target`, what it is a copy of: its inode
    and size (a copy replaced since is not the one described) and the object's ETag or checksum."""
    info = os.fstat(fd)
    document = {"inode": info.st_ino, "size": info.st_size, "etag": etag, "url": redact_url(url)}
    write_file(cache_dir, meta_path(target), json.dumps(document) + "\n")


def cached_copy(target: str, size: int | None, etag: str | None) -> bool:
    """Whether `target` is a complete copy imgcls made (its .meta.json describes it) of the object that is
    now `size` bytes (None: unknown) with ETag or checksum `etag` (None: the store gives none, size only)."""
    try:
        info = os.stat(target)
        with open(meta_path(target), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return False
    if not isinstance(meta, dict) or (meta.get("inode"), meta.get("size")) != (info.st_ino, info.st_size):
        return False
    if size is not None and info.st_size != size:
        return False
    return etag is None or meta.get("etag") == etag


def used(path: str | Path) -> None:
    """Mark a reused entry as used now (its atime; the mtime stays: the keys of index files and counts hold
    a copy's mtime). A read-only cache is still read."""
    with contextlib.suppress(OSError):
        os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns))


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _root(cache_dir: str) -> str:
    """CACHE as an absolute path, tagged (once per process) when imgcls makes the folder or finds it empty.
    A folder that already holds other things is never tagged: the tag would make backup tools skip all of it.
    The tag alone makes nothing prunable: prune also needs the index to name a file."""
    root = os.path.abspath(os.path.expanduser(str(cache_dir)))
    if root not in _marked:
        _marked.add(root)
        with contextlib.suppress(OSError):  # a read-only cache is still read; writes say why they fail
            ours = not os.path.lexists(root)
            if not ours:
                with os.scandir(root) as items:
                    ours = next(items, None) is None
            os.makedirs(root, exist_ok=True)
            if ours:
                fd = os.open(os.path.join(root, TAG), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
                with os.fdopen(fd, "w") as f:
                    f.write(TAG_TEXT)
    return root


# --- what the cache holds (the management side) -------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    kind: str  # one of KINDS, or IN_FLIGHT (a lock, a download or a write under way, or left by a kill)
    path: str
    size: int
    last_used: float  # seconds since the epoch: the later of atime and mtime
    modified: float


@dataclass
class Contents:
    root: str
    entries: list[Entry]
    foreign: list[str]  # paths in CACHE that are not imgcls's (not in its index, or off the layout)

    def by_kind(self, kind: str) -> list[Entry]:
        return [e for e in self.entries if e.kind == kind]


def check_dir(cache_dir: str | None) -> str:
    """The cache folder to manage, absolute; one-line ConfigError when missing."""
    given = cache_dir is not None
    folder = os.path.abspath(os.path.expanduser(cache_dir if cache_dir is not None else default_dir()))
    if os.path.isdir(folder):
        return folder
    key = f"--dir={cache_dir}" if given else f"data.shard_cache={folder} (the default)"
    what = "is not a folder" if os.path.exists(folder) else "does not exist"
    raise ConfigError(
        f"{key} {what}; allowed: a folder that a run used as data.shard_cache "
        "(--dir DIR; default $IMGCLS_CACHE/shards, else ~/.cache/imgcls/shards)"
    )


def is_tagged(root: str) -> bool:
    """Whether CACHE holds imgcls's CACHEDIR.TAG (a file, not a link; another tool's tag is not imgcls's)."""
    tag = os.path.join(root, TAG)
    try:
        if not stat.S_ISREG(os.lstat(tag).st_mode):
            return False
        with open(tag, encoding="utf-8", errors="replace") as f:
            return f.readline().strip() == TAG_SIGNATURE and f.readline().startswith(TAG_OWNER)
    except OSError:
        return False


def _parse_index(data: bytes) -> dict[str, float]:
    """Relative path -> when it was last entered, of the index's well-formed lines inside CACHE."""
    listed: dict[str, float] = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line)
            path, when = str(item["path"]), float(item["time"])
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a kill or a full disk
        parts = path.split(os.sep)
        if os.path.isabs(path) or any(p in ("", ".", "..") for p in parts):
            continue
        listed[path] = max(when, listed.get(path, when))
    return listed


def _read_index(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def listed(root: str) -> dict[str, float]:
    """The files CACHE's index names (relative paths), read without a lock (a listing, not a prune)."""
    try:
        fd = os.open(os.path.join(root, INDEX), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return {}
    try:
        return _parse_index(_read_index(fd)) if stat.S_ISREG(os.fstat(fd).st_mode) else {}
    finally:
        os.close(fd)


def contents(root: str, names: dict[str, float] | None = None) -> Contents:
    """Every file of CACHE's layout that its index names, and the paths that are not imgcls's. Symbolic
    links are never followed (a link in CACHE, or a kind folder that is one, is counted as not imgcls's)."""
    names = listed(root) if names is None else names
    entries: list[Entry] = []
    foreign: list[str] = []
    with os.scandir(root) as top:
        for item in sorted(top, key=lambda e: e.name):
            if item.name in (TAG, INDEX) and item.is_file(follow_symlinks=False):
                continue
            if item.name in KINDS and item.is_dir(follow_symlinks=False):
                for path, info in _walk(item.path):
                    relative = os.path.relpath(path, root)
                    parts = relative.split(os.sep)[1:]
                    entry = _classify(item.name, parts, path, info) if relative in names else None
                    if entry is None:
                        foreign.append(path)
                    elif entry.kind != META:
                        entries.append(entry)
            else:
                foreign.append(item.path)
    return Contents(root, entries, foreign)


def _walk(folder: str) -> Iterator[tuple[str, os.stat_result]]:
    """(path, lstat) of every file below `folder`, symbolic links included as themselves, not followed."""
    try:
        items = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    for item in items:
        if item.is_dir(follow_symlinks=False):
            yield from _walk(item.path)
        else:
            with contextlib.suppress(OSError):  # gone since the listing: another prune, or a rename
                yield item.path, item.stat(follow_symlinks=False)


def _classify(kind: str, parts: list[str], path: str, info: os.stat_result) -> Entry | None:
    """The Entry of a listed file at KIND/PARTS if the layout has it there, else None (not imgcls's). A copy's
    .meta.json is kind META (it goes with its copy) while the copy is there, in flight once it is not."""
    if not stat.S_ISREG(info.st_mode):
        return None
    name = parts[-1]
    if kind == REMOTE:
        placed = len(parts) >= 3 and bool(_SCHEME.fullmatch(parts[0]))
        own = placed
    elif kind == DALI_IDX:
        placed = len(parts) == 2 and bool(_HASH.fullmatch(parts[0]))
        own = placed and name.endswith(".idx")
    else:
        placed = len(parts) == 1
        own = bool(_HASH.fullmatch(name[:16])) and name[16:17] == "-" and name.endswith(".json")
    side = _SIDE.fullmatch(name) if kind == REMOTE else None
    if placed and side and side.group(2) == META and os.path.lexists(os.path.join(os.path.dirname(path), side[1])):
        kind = META
    elif placed and (_TEMP.fullmatch(name) or side):
        kind = IN_FLIGHT
    elif not (placed and own):
        return None
    return Entry(kind, path, info.st_size, max(info.st_atime, info.st_mtime), info.st_mtime)


# --- prune --------------------------------------------------------------------------------------------------


@dataclass
class Pruned:
    removed: list[Entry]
    kept: list[Entry]
    busy: list[Entry]  # chosen but locked by a download, or in flight and recent


def prune(
    root: str, max_size: int | None = None, older_than_days: float | None = None, now: float | None = None
) -> Pruned:
    """Remove in-flight files left by dead processes, then entries last used more than `older_than_days`
    ago, then the least recently used until the imgcls files in CACHE total at most `max_size` bytes. Holds
    the index's lock throughout (writers wait to enter a new file), and writes back the entries of files
    still there (and of recent ones, whose writers may be about to make them)."""
    if not is_tagged(root):
        raise ConfigError(
            f"--dir={root} has no {TAG} of imgcls: not a data.shard_cache that imgcls wrote; "
            "allowed: a folder that a run used as data.shard_cache (prune deletes only there)"
        )
    now = time.time() if now is None else now
    try:
        fd = os.open(os.path.join(root, INDEX), os.O_RDWR | os.O_NOFOLLOW)
    except OSError:  # no index: imgcls made nothing here that it can tell from a user's file
        return Pruned([], [], [])
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return Pruned([], [], [])
        fcntl.flock(fd, fcntl.LOCK_EX)
        names = _parse_index(_read_index(fd))
        result = _prune(root, names, max_size, older_than_days, now)
        kept = {p: t for p, t in names.items() if now - t < TEMP_GRACE_S or os.path.lexists(os.path.join(root, p))}
        text = "".join(json.dumps({"path": p, "time": t}) + "\n" for p, t in sorted(kept.items()))
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, text.encode())
        return result
    finally:
        os.close(fd)


def _prune(
    root: str, names: dict[str, float], max_size: int | None, older_than_days: float | None, now: float
) -> Pruned:
    found = contents(root, names).entries
    result = Pruned([], [], [])
    entries = []
    for entry in found:
        if entry.kind != IN_FLIGHT:
            entries.append(entry)
        elif now - entry.modified >= TEMP_GRACE_S and _remove(root, names, entry):
            result.removed.append(entry)
        else:
            result.kept.append(entry)
    total = sum(e.size for e in entries) + sum(e.size for e in result.kept)
    cutoff = None if older_than_days is None else now - older_than_days * 86400
    for entry in sorted(entries, key=lambda e: (e.last_used, e.path)):
        old = cutoff is not None and entry.last_used < cutoff
        over = max_size is not None and total > max_size
        if not (old or over):
            result.kept.append(entry)
        elif _remove(root, names, entry):
            result.removed.append(entry)
            total -= entry.size
        else:
            result.busy.append(entry)
    result.kept = [e for e in result.kept if os.path.lexists(e.path)]  # a copy's lock went with the copy
    return result


def _remove(root: str, names: dict[str, float], entry: Entry) -> bool:
    """Delete one of imgcls's files unless a writer holds it; False when it is busy (or already gone)."""
    name, folder = os.path.basename(entry.path), os.path.dirname(entry.path)
    if entry.kind == IN_FLIGHT:
        temp = _TEMP.fullmatch(name)
        if temp and temp.group(2) == "tmp":  # a file written whole: no lock, its age is the guard
            return _unlink(root, names, entry.path)
        match = temp or _SIDE.fullmatch(name)
        assert match is not None  # an in-flight entry's name is a temp, lock or record name (see _classify)
        target = os.path.join(folder, match.group(1))
        if not temp and os.path.lexists(target):
            return False  # the lock and the record of a copy go with the copy
        with _try_lock(target) as free:  # a download's .part: kept while its lock is held
            return free and _unlink(root, names, entry.path)
    if entry.kind != REMOTE:  # index files and counts are renamed into place whole: nothing to wait for
        return _unlink(root, names, entry.path)
    with _try_lock(entry.path) as free:
        if free and _unlink(root, names, entry.path):
            _unlink(root, names, meta_path(entry.path))
            _unlink(root, names, lock_path(entry.path))
            return True
    return False


@contextlib.contextmanager
def _try_lock(target: str) -> Iterator[bool]:
    """remote.py's lock of `target`, taken without waiting: True if free (or if there is no lock file)."""
    try:
        fd = os.open(lock_path(target), os.O_RDWR | os.O_NOFOLLOW)
    except OSError:  # no lock file: no download of this file is under way
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _unlink(root: str, names: dict[str, float], path: str) -> bool:
    """Delete `path` if the index names it and it is a regular file, reached folder by folder from CACHE
    without following a link: a folder replaced by a link to elsewhere since the listing stops it."""
    relative = os.path.relpath(path, root)
    if relative not in names:
        return False
    *folders, name = relative.split(os.sep)
    fd = -1
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        for part in folders:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        if not stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            return False
        os.unlink(name, dir_fd=fd)
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)
    return True


# --- the command ------------------------------------------------------------------------------------------

USAGE = (
    "python -m imgcls.data.shards cache [list] [--dir DIR] | "
    "cache prune [--max-size SIZE] [--older-than DAYS] [--dir DIR]"
)
_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)")


def parse_size(text: str, key: str = "--max-size") -> int:
    """'20GB' -> 20 * 10**9 bytes; units B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (of 1024)."""
    match = _SIZE.fullmatch(text.strip().lower())
    if not match or match.group(2) not in ("", *_UNITS):
        raise ConfigError(
            f"{key}={text} is not a size; allowed: a number and a unit B, KB, MB, GB, TB (powers "
            "of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 20GB"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2) or "b"])


def format_size(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def _days(text: str, key: str = "--older-than") -> float:
    try:
        days = float(text)
    except ValueError:
        days = -1.0
    if not days >= 0 or days == float("inf"):
        raise ConfigError(f"{key}={text} is not allowed; a number of days >= 0 since last use (e.g. 30)")
    return days


def _folder(text: str, key: str = "--dir") -> str:
    return text  # checked with the action (check_dir): the default folder is checked the same way


def parse(argv: list[str]) -> dict:
    """`cache` arguments: the action (list, prune) and its options, each mistake one ConfigError line."""
    args: dict = {"action": "list", "dir": None, "max_size": None, "older_than": None}
    options = {"--dir": ("dir", _folder), "--max-size": ("max_size", parse_size), "--older-than": ("older_than", _days)}
    words = list(argv)
    if words and not words[0].startswith("-"):
        args["action"] = words.pop(0)
        if args["action"] not in ("list", "prune"):
            raise ConfigError(f"cache {args['action']} is not a cache command; allowed: list, prune (usage: {USAGE})")
    while words:
        word = words.pop(0)
        key, eq, value = word.partition("=")
        if key not in options:
            raise ConfigError(f"unknown argument {word}; allowed: {', '.join(options)} (usage: {USAGE})")
        if not eq:
            if not words:
                raise ConfigError(f"{key} needs a value (usage: {USAGE})")
            value = words.pop(0)
        name, convert = options[key]
        args[name] = convert(value, key)
    if args["action"] == "list" and (args["max_size"] is not None or args["older_than"] is not None):
        raise ConfigError(
            f"--max-size and --older-than are options of `cache prune`, not of `cache list` (usage: {USAGE})"
        )
    if args["action"] == "prune" and args["max_size"] is None and args["older_than"] is None:
        raise ConfigError(f"cache prune needs --max-size SIZE and/or --older-than DAYS (usage: {USAGE})")
    return args


def report(found: Contents) -> list[str]:
    """The lines of `cache list`: per kind the file count and size, then the total."""
    lines = [f"data.shard_cache={found.root}"]
    for kind in (*KINDS, IN_FLIGHT):
        items = found.by_kind(kind)
        lines.append(f"  {kind:<10} {len(items):>7} files {format_size(sum(e.size for e in items)):>10}")
    total = sum(e.size for e in found.entries)
    lines.append(f"  {'total':<10} {len(found.entries):>7} files {format_size(total):>10} ({total} bytes)")
    if found.foreign:
        lines.append(f"  not imgcls's: {len(found.foreign)} (never pruned), e.g. {found.foreign[0]}")
    return lines


def main(argv: list[str]) -> int:
    """`python -m imgcls.data.shards cache ...` (the dispatch and the error line are in __main__.py)."""
    args = parse(argv)
    root = check_dir(args["dir"])
    if args["action"] == "list":
        print("\n".join(report(contents(root))))
        return 0
    result = prune(root, args["max_size"], args["older_than"])
    size = format_size(sum(e.size for e in result.removed))
    kept = format_size(sum(e.size for e in result.kept + result.busy))
    print(
        f"removed {len(result.removed)} files ({size}) from {root}; kept {len(result.kept) + len(result.busy)} "
        f"({kept})" + (f", {len(result.busy)} of them in use by a download" if result.busy else "")
    )
    return 0
