"""What a shard root's files and a cache folder's other occupants cannot make imgcls do (data/shards/).

A manifest.json (often from a bucket, written by anyone who can write there) and a listing of data.root are
data: their shard names are plain file names in data.root, never a command, a URL or a path elsewhere, and
under a user's own `pipe:` root a name is one quoted word of the command. `cache prune` deletes only files
imgcls entered in its index, in a folder it tagged, without following links. Remote copies follow the umask,
are checked against the object's ETag, and no URL's userinfo or signed query reaches a folder name or a log
line. Real files, real processes, real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import functools
import http.server
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from imgcls.config.schema import DataSchema
from imgcls.data.shards import cache, manifest, remote
from imgcls.data.shards.__main__ import main as shards_main
from imgcls.data.shards.formats import read_records
from imgcls.data.shards.manifest import ShardSet
from imgcls.errors import DataError
from imgcls.typed_config import settings
from tests.conftest import assert_one_line_error, make_image_folder, run_cli, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


def open_shard_set(cfg: dict) -> ShardSet:
    """The test's data keys over the data schema's defaults, as a composed data config has them."""
    return manifest.open_shard_set(settings(DataSchema, cfg))


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ImageFolder converted to webdataset shards with their manifest.json."""
    from imgcls.data.shards.convert import convert

    base = tmp_path_factory.mktemp("untrusted")
    folder = make_image_folder(base / "images", classes=3, train_per_class=8, val_per_class=3)
    convert(folder, base / "wds", "webdataset", shard_size=10, progress=False)
    return base / "wds"


def tampered(converted: Path, into: Path, split: str, name: str) -> Path:
    """A copy of the converted shards whose manifest names the first `split` shard `name`."""
    shutil.copytree(converted, into)
    document = json.loads((into / "manifest.json").read_text())
    document["splits"][split]["shards"][0]["name"] = name
    (into / "manifest.json").write_text(json.dumps(document))
    return into


def cfg(root: str, cache_dir: Path) -> dict:
    return {"root": root, "format": "webdataset", "shard_cache": str(cache_dir), "storage_options": {}}


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def file_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Python's file server over TMP/www: (its URL, the folder)."""
    www = tmp_path / "www"
    www.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(www)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", www
    server.shutdown()


# --- item 2: names from a manifest or a listing -------------------------------------------------------------


def test_a_manifest_shard_that_is_a_command_is_refused_and_never_run(converted: Path, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    root = tampered(converted, tmp_path / "wds", "val", f"pipe:touch {marker}")
    with pytest.raises(DataError) as info:
        open_shard_set(cfg(str(root), tmp_path / "cache"))
    message = str(info.value)
    assert message.startswith(f"{root / 'manifest.json'} names a shard 'pipe:touch {marker}', which is not allowed")
    assert "allowed: a plain file name in data.root" in message and "\n" not in message
    assert not marker.exists()


@pytest.mark.parametrize(
    "name",
    [
        "/etc/passwd",
        "../outside.tar",
        "s3://other-bucket/x.tar",
        "https://evil.example/x.tar",
        "-rf.tar",
        "a b.tar",
        "x.tar\nid",
        "$(id).tar",
        "x.tar|id",
        "",
        "..",
    ],
)
def test_other_names_that_are_not_plain_file_names_are_refused(converted: Path, tmp_path: Path, name: str) -> None:
    root = tampered(converted, tmp_path / "wds", "train", name)
    with pytest.raises(DataError, match=r"^.*manifest\.json names a shard .*, which is not allowed; allowed: "):
        open_shard_set(cfg(str(root), tmp_path / "cache"))


def test_training_on_such_a_manifest_stops_in_one_line(converted: Path, tmp_path: Path) -> None:
    """The reported run: a val shard `pipe:...` ran its command and training finished silently."""
    marker = tmp_path / "MARKER"
    root = tampered(converted, tmp_path / "wds", "val", f"pipe:touch {marker}")
    result = run_cli(
        "train.py",
        *tiny_overrides(root, "data.format=webdataset", f"data.shard_cache={tmp_path / 'cache'}"),
        f"run_dir={tmp_path / 'run'}",
        timeout=300,
    )
    assert_one_line_error(result, "manifest.json names a shard 'pipe:touch", "which is not allowed")
    assert not marker.exists()


def test_a_manifest_from_an_http_server_cannot_run_a_command(
    converted: Path, tmp_path: Path, file_server: tuple[str, Path]
) -> None:
    url, www = file_server
    marker = tmp_path / "MARKER"
    tampered(converted, www / "wds", "val", f"pipe:touch {marker}")
    with pytest.raises(DataError, match=rf"^{url}/wds/manifest\.json names a shard 'pipe:touch .*not allowed"):
        open_shard_set(cfg(f"{url}/wds", tmp_path / "cache"))
    assert not marker.exists()


def test_under_a_pipe_root_a_name_cannot_add_to_the_command(converted: Path, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    root = tampered(converted, tmp_path / "wds", "val", f"validation-00000-of-00001.tar; touch {marker}")
    with pytest.raises(DataError, match=r"names a shard 'validation-00000-of-00001\.tar; touch .*not allowed"):
        open_shard_set(cfg(f"pipe:cat {root}", tmp_path / "cache"))
    assert not marker.exists()
    # Were such a name ever joined (a name is checked first), it would stay one word of the command.
    assert manifest._join("pipe:cat /d", f"x.tar; touch {marker}") == f"pipe:cat /d/'x.tar; touch {marker}'"


def test_a_pipe_root_with_plain_names_still_reads_through_its_command(converted: Path, tmp_path: Path) -> None:
    shard_set = open_shard_set(cfg(f"pipe:cat {converted}", tmp_path / "cache"))
    first = shard_set.splits["val"][0]
    assert first.url == f"pipe:cat {converted}/{Path(first.url).name}"
    copy = remote.local_copy(first.url, str(tmp_path / "cache"))
    local = converted / Path(first.url).name
    assert Path(copy).read_bytes() == local.read_bytes()
    assert len(list(read_records("webdataset", Path(copy).read_bytes()))) == first.count


def test_a_listed_name_that_is_not_a_plain_file_name_is_refused(converted: Path, tmp_path: Path) -> None:
    """Without a manifest, the names come from a listing of data.root: the same rule."""
    root = tmp_path / "bare"
    root.mkdir()
    for path in converted.glob("*.tar"):
        shutil.copy(path, root / path.name)
    odd = "train-00009 $(touch MARKER).tar"
    shutil.copy(next(converted.glob("train-*.tar")), root / odd)
    config = {**cfg(str(root), tmp_path / "cache"), "num_classes": 3}
    expected = f"^the listing of data.root={re.escape(str(root))} names a shard {re.escape(repr(odd))}, which is not"
    with pytest.raises(DataError, match=expected):
        open_shard_set(config)
    assert not (tmp_path / "MARKER").exists()


# --- item 4: the cache --------------------------------------------------------------------------------------


def fill(cache_dir: Path, sources: Path) -> list[Path]:
    """Remote copies (of pipe:cat URLs) that imgcls makes in `cache_dir`."""
    sources.mkdir()
    copies = []
    for name in ("a.tar", "b.tar"):
        (sources / name).write_bytes(os.urandom(2000))
        copies.append(Path(remote.local_copy(f"pipe:cat {sources / name}", str(cache_dir))))
    return copies


def test_prune_deletes_imgcls_copies_and_never_a_users_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reported run: `cache prune --max-size 0 --dir mydir` deleted mydir/remote/backup/2024/thesis.tex
    (mydir was empty when a run used it, so it was tagged; any file three levels under remote/ counted)."""
    mydir = tmp_path / "mydir"
    mydir.mkdir()
    copies = fill(mydir, tmp_path / "src")
    assert (mydir / cache.TAG).is_file()  # empty when the run came: imgcls's cache since
    thesis = mydir / "remote" / "backup" / "2024" / "thesis.tex"
    thesis.parent.mkdir(parents=True)
    thesis.write_text("chapter 1")
    counts = mydir / "counts" / "0123456789abcdef-notes.tar.json"  # where a count would be
    counts.parent.mkdir()
    counts.write_text("{}")
    empty = mydir / "remote" / "pipe" / "empty-folder"
    empty.mkdir()
    assert shards_main(["cache", "prune", "--max-size", "0", "--dir", str(mydir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("removed "), out
    assert not any(p.exists() for p in copies)
    assert thesis.read_text() == "chapter 1" and counts.read_text() == "{}" and empty.is_dir()
    assert shards_main(["cache", "list", "--dir", str(mydir)]) == 0
    assert "not imgcls's: 2 (never pruned)" in capsys.readouterr().out


def test_a_folder_with_a_users_files_is_not_tagged_even_as_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMGCLS_CACHE", str(tmp_path / "home-cache"))
    default = Path(cache.default_dir())
    default.mkdir(parents=True)
    (default / "mine.txt").write_text("the user's")
    (tmp_path / "a.tar").write_bytes(b"x" * 10)
    remote.local_copy(f"pipe:cat {tmp_path / 'a.tar'}", str(default))
    assert not (default / cache.TAG).exists()


def test_prune_never_deletes_through_a_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A link in the cache to a file elsewhere, and a copy's folder replaced by a link to a folder elsewhere
    after prune listed it (the file there has the copy's name): neither target is touched."""
    root = tmp_path / "cache"
    copies = fill(root, tmp_path / "src")
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "keep.tar"
    target.write_bytes(b"keep me")
    (copies[0].parent / "link.tar").symlink_to(target)
    cache.record(str(root), copies[0].parent / "link.tar")  # even were it in the index

    listing = cache.contents(str(root))
    swapped = copies[1].parent
    (outside / copies[1].name).write_bytes(b"keep me too")
    shutil.rmtree(swapped)
    swapped.symlink_to(outside, target_is_directory=True)
    monkeypatch.setattr(cache, "contents", lambda *args, **kwargs: listing)
    cache.prune(str(root), max_size=0)
    assert target.read_bytes() == b"keep me" and (outside / copies[1].name).read_bytes() == b"keep me too"
    assert not copies[0].exists()


def test_a_lock_or_an_index_that_is_a_link_is_not_written_through(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (tmp_path / "a.tar").write_bytes(b"x" * 10)
    url = f"pipe:cat {tmp_path / 'a.tar'}"
    target = Path(cache.copy_path(str(root), url))
    target.parent.mkdir(parents=True)
    (root / cache.INDEX).symlink_to(tmp_path / "index-elsewhere")
    Path(cache.lock_path(str(target))).symlink_to(tmp_path / "lock-elsewhere")
    assert Path(remote.local_copy(url, str(root))).read_bytes() == b"x" * 10
    assert not (tmp_path / "index-elsewhere").exists() and not (tmp_path / "lock-elsewhere").exists()


@pytest.mark.parametrize("umask", [0o077, 0o022])
def test_a_cached_copy_follows_the_umask(tmp_path: Path, umask: int) -> None:
    (tmp_path / "a.tar").write_bytes(b"x" * 10)
    code = (
        f"import os; os.umask({umask:#o}); from imgcls.data.shards import remote; "
        f"print(remote.local_copy('pipe:cat {tmp_path / 'a.tar'}', {str(tmp_path / 'cache')!r}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert stat.S_IMODE(os.stat(done.stdout.strip()).st_mode) == 0o666 & ~umask


class _Objects(http.server.BaseHTTPRequestHandler):
    """/obj: `data` with ETag `etag`; GETs counted."""

    data = b""
    etag = ""
    gets = 0

    def _head(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.data)))
        self.send_header("ETag", f'"{self.etag}"')
        self.end_headers()

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._head()

    def do_GET(self) -> None:  # noqa: N802
        type(self).gets += 1
        self._head()
        self.wfile.write(self.data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def objects() -> Iterator[str]:
    _Objects.data, _Objects.etag, _Objects.gets = os.urandom(5000), "v1", 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Objects)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_an_object_changed_to_the_same_size_is_downloaded_again(objects: str, tmp_path: Path) -> None:
    url = f"http://{objects}/obj"
    first = _Objects.data
    assert Path(remote.local_copy(url, str(tmp_path))).read_bytes() == first
    assert remote.local_copy(url, str(tmp_path)) and _Objects.gets == 1  # same ETag: reused
    _Objects.data, _Objects.etag = os.urandom(len(first)), "v2"
    assert Path(remote.local_copy(url, str(tmp_path))).read_bytes() == _Objects.data
    assert _Objects.gets == 2


def test_a_urls_password_and_signature_reach_no_folder_name_and_no_log_line(
    objects: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://reader:hunter2pw@{objects}/obj?X-Amz-Signature=sigsecret42"
    with caplog.at_level(logging.INFO, logger="imgcls"):
        copy = Path(remote.local_copy(url, str(tmp_path / "cache")))
    assert copy.read_bytes() == _Objects.data
    names = [str(p.relative_to(tmp_path)) for p in (tmp_path / "cache").rglob("*")]
    texts = [p.read_text(errors="replace") for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert f"remote/http/{objects}" in str(copy)
    assert not any("hunter2pw" in n or "sigsecret42" in n for n in names), names
    assert not any("hunter2pw" in t or "sigsecret42" in t for t in texts)
    assert any("downloading" in r.getMessage() for r in caplog.records)
    assert not any("hunter2pw" in r.getMessage() or "sigsecret42" in r.getMessage() for r in caplog.records)
    with pytest.raises(DataError) as info:  # a failure's line too
        remote.local_copy("http://reader:hunter2pw@127.0.0.1:9/x.tar", str(tmp_path / "cache"))
    assert "hunter2pw" not in str(info.value)
