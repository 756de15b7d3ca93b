"""Shard files behind URLs (s3://, gs://, https://, pipe:CMD): read through fsspec, copied once into a local cache.

Both backends read local files (DALI's readers take paths; the torchvision path reads a shard whole), so a
remote shard is downloaded into `data.shard_cache` before it is read, at
`CACHE/remote/<scheme>/<bucket-or-host>/<path>` (readable as the umask allows, the same across runs; cache.py
owns the layout and prunes it). A cached copy is reused only when it is the copy imgcls made (its
`.NAME.meta.json` names its inode and size) of the object as it is now: the same size and, where the store
gives one (S3's ETag, GCS's md5, an HTTP server's ETag), the same ETag or checksum, recorded at download (one
`info` request). A changed object is downloaded again, also one changed to the same size.

A download goes to a temp file (`.NAME.XXXXXXXX.part`, beside the copy) that is renamed over the cache path
only when complete and of the listed size: a killed or failed download never leaves a short file under the shard's
name. Several ranks and DataLoader workers can ask for the same shard at once: a lock file next to the copy
makes the others wait for the first download instead of repeating it; where the filesystem cannot lock
(some NFS mounts) each downloads its own temp file, and the renames replace one complete copy by another.

Every failure is one line naming the URL, the reason and the key to change: a DataError (no such object or
bucket, no credentials, connection refused, a missing fsspec implementation such as gcsfs), a ConfigError
(an option in data.storage_options the filesystem refuses), a StorageError (the cache disk).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import posixpath
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from imgcls.data.shards import cache
from imgcls.errors import ConfigError, DataError, StorageError
from imgcls.redaction import redact_url
from imgcls.storage import readable_mode

log = logging.getLogger(__name__)

PIPE = cache.PIPE
_CHUNK = 1 << 20
# What identifies an object's content, by fsspec implementation: s3fs "ETag", gcsfs "md5Hash"/"etag",
# HTTP "ETag"/"Content-MD5"/"Digest" (then "Last-Modified", a plain http.server's only one), adlfs
# "etag"/"content_settings"; first found wins. None of them: the size alone.
_CHECKSUM_KEYS = ("ETag", "etag", "md5", "md5Hash", "checksum", "crc32c", "Content-MD5", "Digest", "Last-Modified")


def is_remote(path: str) -> bool:
    """True for a URL imgcls must fetch (s3://, gs://, https://, pipe:CMD); False for a local path or file://."""
    path = str(path)
    if path.startswith(PIPE):
        return True
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.lower() != "file" and "/" not in scheme


def read_text(url: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """The whole text of a small file (a manifest): local, remote, or the stdout of `pipe:CMD`."""
    url = str(url)
    if not is_remote(url):
        path = _local_path(url)
        try:
            with open(path, "rb") as f:
                return _text(f.read(), path)
        except OSError as exc:
            raise DataError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    if url.startswith(PIPE):
        with tempfile.TemporaryFile() as out:
            _run_pipe(url, out)
            out.seek(0)
            return _text(out.read(), url)
    fs, path = _filesystem(url, storage_options)
    try:
        _invalidate(fs, path)
        data = fs.cat_file(path)
    except Exception as exc:  # fsspec implementations raise their own types (botocore, aiohttp): one line each
        raise _failure("read", url, exc) from None
    return _text(data, url)


def list_names(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The names of the files directly in the folder `url` (not sub-folders), sorted."""
    url = str(url).rstrip("/")
    if not is_remote(url):
        path = _local_path(url)
        try:
            return sorted(e.name for e in os.scandir(path) if e.is_file())
        except OSError as exc:
            raise DataError(f"cannot list {path}: {exc.strerror or type(exc).__name__}") from None
    if url.startswith(PIPE):
        raise DataError(
            f"cannot list the files of {url}: a pipe: root needs a manifest.json "
            "(python -m imgcls.data.shards convert writes one)"
        )
    fs, path = _filesystem(url, storage_options)
    try:
        _invalidate(fs, path)
        entries = fs.ls(path, detail=True)
    except Exception as exc:
        raise _failure("list", url, exc) from None
    return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries if e.get("type") == "file")


def local_copy(url: str, cache_dir: str | None, storage_options: Mapping[str, Any] | None = None) -> str:
    """A local path holding the bytes of `url`: the path itself when local, else a copy under `cache_dir`,
    downloaded once (reused while the object keeps its size and ETag or checksum), atomically; safe when
    several processes ask at once. pipe:CMD runs CMD once and keeps its stdout (there is nothing remote to
    compare: delete the copy to fetch it again); so is an HTTP file whose server states no size or ETag."""
    url = str(url)
    if not is_remote(url):
        return _local_path(url)
    if cache_dir is None or str(cache_dir).strip() in ("", "None"):  # str(None) from a caller's str(cfg.shard_cache)
        raise ConfigError(
            f"data.shard_cache is not set; {url} is copied there before it is read (set a folder on local disk)"
        )
    cache_dir = str(cache_dir)
    target = cache.copy_path(cache_dir, url)
    if url.startswith(PIPE):
        if cache.cached_copy(target, None, None):
            cache.used(target)
        else:
            with _lock(cache_dir, target):
                if not cache.cached_copy(target, None, None):
                    _download(cache_dir, url, target, lambda tmp: _run_pipe_to(url, tmp), size=None, etag=None)
        return target
    fs, path = _filesystem(url, storage_options)
    size, etag = _remote_info(fs, path, url)
    if cache.cached_copy(target, size, etag):
        cache.used(target)
        return target
    with _lock(cache_dir, target):
        if not cache.cached_copy(target, size, etag):  # another process may have fetched it while we waited
            # a URL's userinfo and a signed URL's query are credentials: neither goes to the log
            log.info("downloading %s (%s bytes) to %s", redact_url(url), size, target)
            _download(cache_dir, url, target, lambda tmp: _copy_remote(fs, path, url, tmp), size=size, etag=etag)
    return target


def local_copies(
    urls: list[str], cache_dir: str, storage_options: Mapping[str, Any] | None = None, threads: int = 8
) -> list[str]:
    """local_copy of each URL, `threads` downloads at a time (one S3 stream reaches a fraction of a
    node's bandwidth); the paths in the order of `urls`; the first failure is raised."""
    if not any(is_remote(u) for u in urls):
        return [_local_path(str(u)) for u in urls]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(threads, len(urls)))) as pool:
        return list(pool.map(lambda u: local_copy(u, cache_dir, storage_options), urls))


# -- internals -----------------------------------------------------------------------------------------------


def _text(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{where} is not UTF-8 text (byte {exc.start}); a manifest.json was expected") from None


def _local_path(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def _plain(options: Any) -> Any:
    """OmegaConf containers -> dicts and lists: fsspec and botocore's Config want plain ones."""
    if isinstance(options, Mapping):
        return {str(k): _plain(v) for k, v in options.items()}
    if isinstance(options, Sequence) and not isinstance(options, (str, bytes)):
        return [_plain(v) for v in options]
    return options


def _filesystem(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    import fsspec  # import cost (~0.3 s with aiohttp) only for a run that reads URLs

    scheme = url.partition("://")[0].lower()
    options = _plain(storage_options or {})
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError:
        from fsspec.registry import known_implementations

        known = known_implementations.get(scheme, {})
        package = known.get("class", "").split(".")[0] or f"an fsspec implementation for {scheme}://"
        raise DataError(f"cannot read {url}: {scheme}:// needs the package {package} (pip install {package})") from None
    except ValueError as exc:
        raise DataError(f"cannot read {url}: {str(exc).splitlines()[0]}") from None
    except TypeError as exc:  # an option the filesystem does not take
        # (the options themselves stay out of the message: they may hold a secret key)
        raise ConfigError(f"data.storage_options is not accepted for {url}: {str(exc).splitlines()[0]}") from None


def _invalidate(fs: Any, path: str) -> None:
    # fsspec keeps directory listings per filesystem instance (instances are shared within a process): a
    # listing made earlier must not stand in for the object's current size.
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)


def _remote_info(fs: Any, path: str, url: str) -> tuple[int | None, str | None]:
    """The object's size and ETag or checksum; each None where the store does not state it (both None: as for
    pipe:, a copy once made is kept)."""
    _invalidate(fs, path)
    try:
        info = fs.info(path)
    except Exception as exc:
        raise _failure("read", url, exc) from None
    if info.get("type") == "directory":
        raise DataError(f"cannot read {url}: it is a folder, not a shard file")
    size = info.get("size")
    etag = next((str(info[k]) for k in _CHECKSUM_KEYS if info.get(k) not in (None, "")), None)
    return (None if size is None else int(size)), etag


@contextlib.contextmanager
def _lock(cache_dir: str, target: str) -> Iterator[None]:
    folder = os.path.dirname(target)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create {folder} (data.shard_cache): {exc.strerror or type(exc).__name__}") from None
    fd = None
    with contextlib.suppress(OSError):  # no lock file or no flock: each process downloads its own temp file
        fd = cache.open_lock(cache_dir, target)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing releases the lock


def _download(cache_dir: str, url: str, target: str, fetch: Any, size: int | None, etag: str | None) -> None:
    """fetch(temp path) writes the bytes; they become `target` only when complete, with their record (the
    ETag or checksum `etag` they were fetched for) beside them."""
    fd, tmp = -1, ""
    try:
        fd, tmp = cache.download_temp(cache_dir, target)
        fetch(tmp)  # fsspec writes by name (s3fs opens the path): the name must still be our temp afterwards
        made, now = os.fstat(fd), os.lstat(tmp)
        if (now.st_dev, now.st_ino) != (made.st_dev, made.st_ino):
            raise StorageError(f"cannot write {target} (data.shard_cache): {tmp} was replaced during the download")
        got = made.st_size
        if size is not None and got != size:
            raise DataError(f"cannot read {redact_url(url)}: the download stopped at {got} of {size} bytes")
        os.fchmod(fd, readable_mode())  # as readable as the user's other files: the umask decides, not imgcls
        cache.write_meta(cache_dir, target, fd, etag, url)
        cache.record(cache_dir, target)
        os.replace(tmp, target)
    except BaseException as exc:
        if tmp:
            with contextlib.suppress(OSError):
                if os.lstat(tmp).st_ino == os.fstat(fd).st_ino:
                    os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
            raise StorageError(
                f"cannot write {target} (data.shard_cache): {exc.strerror or type(exc).__name__}"
            ) from None
        raise
    finally:
        if fd >= 0:
            os.close(fd)


def _copy_remote(fs: Any, path: str, url: str, tmp: str) -> None:
    # get_file: HTTP, one GET; s3fs, one GET resumed with a Range after a dropped read, or above its block
    # size (50 MiB) ranged parts fetched at once (max_concurrency, 10) and written in place. Not fs.open +
    # read: fsspec's HTTP file reads in ranges and takes a short 200 reply from a server that ignores Range
    # for the range asked, so a changed object came back as its first half twice, at the listed size.
    try:
        fs.get_file(path, tmp)
    except OSError as exc:
        if exc.errno in _LOCAL_WRITE_ERRORS:  # the cache disk, not the server
            raise StorageError(f"cannot write in {os.path.dirname(tmp)} (data.shard_cache): {exc.strerror}") from None
        raise _failure("read", url, exc) from None
    except Exception as exc:
        raise _failure("read", url, exc) from None


_LOCAL_WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def _run_pipe_to(url: str, tmp: str) -> None:
    with open(tmp, "wb") as out:
        _run_pipe(url, out)


def _run_pipe(url: str, out: Any) -> None:
    # webdataset's `pipe:` convention: the rest of the URL is a shell command whose stdout is the file
    # (curl, aws s3 cp - , gsutil cat ...); its stderr goes to ours, where the user sees the tool's message.
    command = url[len(PIPE) :]
    try:
        proc = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE)
    except OSError as exc:
        raise DataError(f"cannot run {url}: {exc.strerror or type(exc).__name__}") from None
    assert proc.stdout is not None
    try:
        shutil.copyfileobj(proc.stdout, out, _CHUNK)
    finally:
        proc.stdout.close()
        code = proc.wait()
    if code != 0:
        raise DataError(f"cannot read {url}: the command exited with code {code}")


def _failure(verb: str, url: str, exc: BaseException) -> Exception:
    chain = [exc] + ([exc.__cause__] if exc.__cause__ is not None else [])
    for e in chain:
        if isinstance(e, TypeError):  # fsspec hands unknown options to the client, which refuses them there
            return ConfigError(f"data.storage_options is not accepted for {url}: {str(e).splitlines()[0]}")
    # a URL's userinfo and a signed query stay out of the line (aiohttp's messages quote the URL too)
    return DataError(redact_url(f"cannot {verb} {url}: {_reason(chain)}"))


_CONNECTION = {
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ClientConnectorError",
    "ConnectionError",
    "ServerDisconnectedError",
    "ClientOSError",
    "ClientPayloadError",
    "TimeoutError",
}


def _reason(chain: list[BaseException]) -> str:
    """One line for an fsspec/botocore/aiohttp failure, with the setting that usually fixes it. `chain`: the
    exception and its cause (fsspec's HTTP filesystem reports any failed request as FileNotFoundError)."""
    exc = chain[0]
    names = {c.__name__ for e in chain for c in type(e).__mro__}
    text = " ".join(str(exc).split()) or type(exc).__name__
    if "NoCredentialsError" in names or "PartialCredentialsError" in names:
        return (
            f"no credentials ({text}); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, "
            "data.storage_options.key/secret, or data.storage_options.anon=true for a public bucket"
        )
    if names & _CONNECTION:
        cause = chain[-1]
        detail = " ".join(str(cause).split()) or type(cause).__name__
        return f"cannot connect ({detail}); check the network and data.storage_options.endpoint_url"
    if isinstance(exc, FileNotFoundError):
        return f"no such object or bucket ({text})"
    if isinstance(exc, PermissionError):
        return f"access denied ({text}); check the credentials and data.storage_options"
    return f"{type(exc).__name__}: {text}"
