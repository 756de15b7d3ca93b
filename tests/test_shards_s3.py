"""Remote shards (imgcls.data.shards.remote) against real servers on 127.0.0.1: moto's S3 server (the real
HTTP protocol, s3fs + botocore as users run them) and a small HTTP server that can cut a download short."""

from __future__ import annotations

import http.server
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from imgcls.config.schema import DataSchema
from imgcls.data.shards import remote
from imgcls.data.shards.cache import INDEX, TAG, copy_path
from imgcls.data.shards.manifest import open_shard_set
from imgcls.errors import ConfigError, DataError
from imgcls.typed_config import settings
from tests.conftest import compose_config, make_image_folder, read_report, run_cli, tiny_overrides

BUCKET = "imgcls-shards"
CREDENTIALS = {"key": "testing", "secret": "testing"}


class _RequestLog(logging.Handler):
    """The S3 server's own access log (werkzeug's, one record per request served): counts real GETs."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def gets(self, key: str) -> int:
        return sum(f"GET /{BUCKET}/{key} HTTP" in line for line in self.lines)  # lines may carry colour codes


class S3:
    def __init__(self, endpoint: str, requests: _RequestLog) -> None:
        import boto3

        self.endpoint = endpoint
        self.requests = requests
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        self.options = {"endpoint_url": endpoint, **CREDENTIALS}

    def put(self, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=BUCKET, Key=key, Body=data)
        return f"s3://{BUCKET}/{key}"


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    from moto.server import ThreadedMotoServer

    requests = _RequestLog()
    werkzeug = logging.getLogger("werkzeug")
    level = werkzeug.level
    werkzeug.addHandler(requests)
    werkzeug.setLevel(logging.INFO)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    store = S3(f"http://{host}:{port}", requests)
    store.client.create_bucket(Bucket=BUCKET)
    yield store
    server.stop()
    werkzeug.removeHandler(requests)
    werkzeug.setLevel(level)


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_is_remote() -> None:
    assert all(map(remote.is_remote, ["s3://b/k", "gs://b/k", "https://h/k", "pipe:cat x"]))
    assert not any(map(remote.is_remote, ["/data/imagenet", "relative/dir", "file:///data/x", "C:/x"]))


@pytest.mark.slow
def test_local_copy_downloads_once_and_refreshes_a_changed_object(s3: S3, tmp_path: Path) -> None:
    key = "once/train-00000-of-00001.tar"
    first = os.urandom(300_000)
    url = s3.put(key, first)
    path = remote.local_copy(url, str(tmp_path), s3.options)
    assert path == str(tmp_path / "remote" / "s3" / BUCKET / key)
    assert Path(path).read_bytes() == first
    assert s3.requests.gets(key) == 1

    assert remote.local_copy(url, str(tmp_path), s3.options) == path
    assert s3.requests.gets(key) == 1, "a cached copy of the listed size must not be downloaded again"

    second = os.urandom(200_000)
    s3.put(key, second)
    assert Path(remote.local_copy(url, str(tmp_path), s3.options)).read_bytes() == second
    assert s3.requests.gets(key) == 2
    assert [n for n in _files(tmp_path) if ".part" in n] == []

    # a listing (open_shard_set makes one) fills fsspec's listing cache with the sizes of that moment
    assert "train-00000-of-00001.tar" in remote.list_names(f"s3://{BUCKET}/once", s3.options)
    third = os.urandom(100_000)
    s3.put(key, third)
    assert Path(remote.local_copy(url, str(tmp_path), s3.options)).read_bytes() == third
    # the same size, another ETag: a check of the size alone took the old copy for the new object
    fourth = os.urandom(100_000)
    s3.put(key, fourth)
    assert Path(remote.local_copy(url, str(tmp_path), s3.options)).read_bytes() == fourth


def test_a_truncated_copy_is_replaced_and_temp_files_are_not_used(s3: S3, tmp_path: Path) -> None:
    """What a download killed by an older tool (or a full disk) would leave: a short file at the cache path
    and a stray temp file next to it. Neither is taken for the shard."""
    key = "partial/train-00000-of-00001.tar"
    data = os.urandom(100_000)
    url = s3.put(key, data)
    target = Path(copy_path(str(tmp_path), url))
    target.parent.mkdir(parents=True)
    target.write_bytes(data[:50_000])
    (target.parent / f".{target.name}.abc123.part").write_bytes(data)
    assert Path(remote.local_copy(url, str(tmp_path), s3.options)).read_bytes() == data


def test_concurrent_callers_share_one_download(s3: S3, tmp_path: Path) -> None:
    key = "concurrent/train-00000-of-00001.tar"
    data = os.urandom(2_000_000)
    url = s3.put(key, data)
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: remote.local_copy(url, str(tmp_path), s3.options), range(4)))
    assert len(set(paths)) == 1 and Path(paths[0]).read_bytes() == data
    assert s3.requests.gets(key) == 1, "the lock file should make the other callers wait for the first download"


def test_a_large_object_in_parallel_ranged_parts(s3: S3, tmp_path: Path) -> None:
    """s3fs fetches an object above its block size (50 MiB: an ImageNet shard) as ranged parts at once;
    a 1 MiB block size takes that path with a small object."""
    data = os.urandom(3_500_000)
    url = s3.put("large/train-00000-of-00001.tar", data)
    options = {**s3.options, "default_block_size": 1 << 20, "max_concurrency": 3}
    assert Path(remote.local_copy(url, str(tmp_path), options)).read_bytes() == data
    assert s3.requests.gets("large/train-00000-of-00001.tar") == 5, "the first GET, then one per 1 MiB part"


def test_local_copies_keeps_the_order(s3: S3, tmp_path: Path) -> None:
    blobs = [os.urandom(10_000 + i) for i in range(6)]
    urls = [s3.put(f"many/train-{i:05d}.tar", blob) for i, blob in enumerate(blobs)]
    paths = remote.local_copies(urls, str(tmp_path), s3.options, threads=3)
    assert [Path(p).read_bytes() for p in paths] == blobs
    assert remote.local_copies(["/a/b", "file:///c"], str(tmp_path)) == ["/a/b", "/c"]


def test_list_names_and_read_text(s3: S3) -> None:
    s3.put("listing/manifest.json", b'{"format": "webdataset"}')
    s3.put("listing/train-00001-of-00002.tar", b"b")
    s3.put("listing/train-00000-of-00002.tar", b"a")
    s3.put("listing/sub/deeper.tar", b"c")
    root = f"s3://{BUCKET}/listing"
    assert remote.list_names(root + "/", s3.options) == [
        "manifest.json",
        "train-00000-of-00002.tar",
        "train-00001-of-00002.tar",
    ]
    assert remote.read_text(root + "/manifest.json", s3.options) == '{"format": "webdataset"}'
    binary = s3.put("binary/manifest.json", b"\x1f\x8b\x08\x00\xff")  # a gzipped file under the name
    with pytest.raises(DataError, match=r"^s3://imgcls-shards/binary/manifest\.json is not UTF-8 text \(byte 1\)"):
        remote.read_text(binary, s3.options)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("url", "options", "expected"),
    [
        (f"s3://{BUCKET}/missing/train-0.tar", "s3", f"cannot read s3://{BUCKET}/missing/train-0.tar: no such object"),
        (
            "s3://no-such-bucket/train-0.tar",
            "s3",
            "cannot read s3://no-such-bucket/train-0.tar: no such object or "
            "bucket (The specified bucket does not exist)",
        ),
        (
            "s3://imgcls-shards/x.tar",
            {"endpoint_url": "http://127.0.0.1:9", **CREDENTIALS, "config_kwargs": {"retries": {"max_attempts": 1}}},
            "cannot read s3://imgcls-shards/x.tar: cannot connect (Could not connect to the endpoint URL",
        ),
        (
            "gs://bucket/train-0.tar",
            {},
            "cannot read gs://bucket/train-0.tar: gs:// needs the package gcsfs (pip install gcsfs)",
        ),
        ("https://127.0.0.1:9/train-0.tar", {}, "cannot read https://127.0.0.1:9/train-0.tar: cannot connect"),
    ],
)
def test_errors_are_one_line(s3: S3, tmp_path: Path, url: str, options: object, expected: str) -> None:
    with pytest.raises(DataError) as info:
        remote.local_copy(url, str(tmp_path), s3.options if options == "s3" else options)
    message = str(info.value)
    assert message.startswith(expected) and "\n" not in message, message
    assert [n for n in _files(tmp_path) if n != TAG] == [], "a failed download leaves nothing but the cache's tag"


def test_no_credentials_is_one_line(s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no 1 s wait for an instance-metadata server
    # skip_instance_cache: fsspec would hand back an S3FileSystem made earlier with credentials in the env
    options = {"endpoint_url": s3.endpoint, "skip_instance_cache": True}
    with pytest.raises(DataError, match=r"^cannot read s3://imgcls-shards/k\.tar: no credentials .*AWS_ACCESS_KEY_ID"):
        remote.local_copy(f"s3://{BUCKET}/k.tar", str(tmp_path / "cache"), options)


def test_no_cache_folder_is_one_line(tmp_path: Path) -> None:
    for unset in (None, "", "None"):
        with pytest.raises(ConfigError, match=r"^data\.shard_cache is not set; s3://b/k\.tar is copied there"):
            remote.local_copy("s3://b/k.tar", unset, {})
    assert remote.local_copy(str(tmp_path), None) == str(tmp_path), "a local path needs no cache"


def test_an_unknown_storage_option_names_the_key(s3: S3, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^data\.storage_options is not accepted .*'endpointurl'"):
        remote.local_copy(f"s3://{BUCKET}/k.tar", str(tmp_path), {"endpointurl": s3.endpoint, **CREDENTIALS})


def test_pipe_runs_once_and_caches_stdout(tmp_path: Path) -> None:
    source = tmp_path / "train-00000-of-00001.tar"
    source.write_bytes(os.urandom(70_000))
    cache = tmp_path / "cache"
    url = f"pipe:cat {source}"
    path = remote.local_copy(url, str(cache), {})
    assert Path(path).name == source.name and Path(path).read_bytes() == source.read_bytes()
    source.write_bytes(b"changed")  # no remote size to compare: the copy stands until deleted (documented)
    assert Path(remote.local_copy(url, str(cache), {})).read_bytes() != b"changed"
    assert remote.read_text(f"pipe:echo {'{}'}", {}) == "{}\n"
    assert Path(copy_path(str(cache), "pipe:aws s3 cp s3://b/wds/train-7.tar -")).name == "train-7.tar"


def test_a_failing_pipe_leaves_no_copy(tmp_path: Path) -> None:
    source = tmp_path / "train-00000-of-00001.tar"
    source.write_bytes(os.urandom(70_000))
    url = f"pipe:head -c 1000 {source}; exit 3"  # some bytes, then a failure: they must not become the shard
    with pytest.raises(DataError, match=r"^cannot read pipe:head .*: the command exited with code 3$"):
        remote.local_copy(url, str(tmp_path / "cache"), {})
    assert [n for n in _files(tmp_path / "cache") if not n.endswith(".lock") and n not in (TAG, INDEX)] == []


# -- a download cut short: the server disconnects, or the process is killed mid-transfer ----------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves /full (DATA), /cut (states len(DATA), sends half, closes), /stall (half, then waits), /shrunk
    (HEAD states len(DATA), GET sends a complete shorter body: the object changed between the two requests),
    /nosize (DATA without a Content-Length, the end marked by closing)."""

    data = b""
    stall = threading.Event()

    def _head(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.data)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.endswith("/nosize"):
            self.send_response(200)
            self.end_headers()
            return
        self._head()

    def do_GET(self) -> None:  # noqa: N802
        if self.path.endswith("/nosize"):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(self.data)
            self.close_connection = True
            return
        if self.path.endswith("/shrunk"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(self.data) // 2))
            self.end_headers()
            self.wfile.write(self.data[: len(self.data) // 2])
            return
        self._head()
        if self.path.endswith("/full"):
            self.wfile.write(self.data)
            return
        self.wfile.write(self.data[: len(self.data) // 2])
        self.wfile.flush()
        if self.path.endswith("/stall"):
            self.stall.wait(30)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that closes early (fsspec reading only the headers, a killed download)


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    _Handler.data = os.urandom(1_000_000)
    server = _QuietServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _Handler.stall.set()
    server.shutdown()


def test_https_path_and_a_server_that_disconnects(http_server: str, tmp_path: Path) -> None:
    path = remote.local_copy(f"{http_server}/shards/full", str(tmp_path), {})
    assert path == str(tmp_path / "remote" / "http" / http_server.split("//")[1] / "shards" / "full")
    assert Path(path).read_bytes() == _Handler.data
    with pytest.raises(DataError, match=rf"^cannot read {http_server}/shards/cut: "):
        remote.local_copy(f"{http_server}/shards/cut", str(tmp_path), {})
    assert sorted(p.name for p in (tmp_path / "remote" / "http").rglob("*") if p.is_file() and "cut" in p.name) == [
        ".cut.lock"
    ], "a cut download leaves no file but the lock"
    with pytest.raises(DataError, match=r"shards/shrunk: the download stopped at 500000 of 1000000 bytes$"):
        remote.local_copy(f"{http_server}/shards/shrunk", str(tmp_path), {})
    assert not Path(copy_path(str(tmp_path), f"{http_server}/shards/shrunk")).exists()


def test_a_server_that_states_no_size(http_server: str, tmp_path: Path) -> None:
    url = f"{http_server}/shards/nosize"
    first = Path(remote.local_copy(url, str(tmp_path), {}))
    assert first.read_bytes() == _Handler.data
    inode = first.stat().st_ino  # a new download would be a new file renamed over it
    assert remote.local_copy(url, str(tmp_path), {}) == str(first)
    assert first.stat().st_ino == inode, "without a size to compare, a copy once made is kept"


@pytest.mark.slow
def test_a_killed_download_leaves_no_shard(http_server: str, tmp_path: Path) -> None:
    url = f"{http_server}/shards/stall"
    code = f"from imgcls.data.shards.remote import local_copy; local_copy({url!r}, {str(tmp_path)!r}, {{}})"
    proc = subprocess.Popen([sys.executable, "-c", code])
    target = Path(copy_path(str(tmp_path), url))
    deadline = time.monotonic() + 30
    # killed mid-transfer: half the bytes are in the temp file, the server holds the connection open
    while not any(p.name.endswith(".part") and p.stat().st_size > 0 for p in target.parent.glob(".*")):
        assert proc.poll() is None and time.monotonic() < deadline, "the download never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not target.exists(), "a killed download must not leave a file under the shard's name"


# -- a converted folder in the bucket, described by shards/manifest.py through this module -------------------


@pytest.fixture(scope="module")
def uploaded(s3: S3, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tiny ImageFolder converted to webdataset shards (imgcls.data.shards.convert), uploaded to the bucket
    under wds/ (with its manifest) and bare/ (shards only, as from another tool)."""
    from imgcls.data.shards.convert import convert

    base = tmp_path_factory.mktemp("shards")
    folder = make_image_folder(base / "images", classes=3, train_per_class=8, val_per_class=3)
    convert(folder, base / "wds", "webdataset", shard_size=10, progress=False)
    for path in sorted((base / "wds").iterdir()):
        s3.put(f"wds/{path.name}", path.read_bytes())
        if path.suffix == ".tar":
            s3.put(f"bare/{path.name}", path.read_bytes())
    return base / "wds", f"s3://{BUCKET}/wds"


def _data_cfg(root: str, cache: Path, options: dict, **extra: object) -> DataSchema:
    """The test's data keys over the data schema's defaults, as a composed data config has them."""
    return settings(
        DataSchema,
        {
            "root": root,
            "format": "webdataset",
            "label_base": "auto",
            "num_classes": None,
            "index_dir": None,
            "shard_cache": str(cache),
            "storage_options": options,
            **extra,
        },
    )


def test_a_bucket_reads_as_its_local_folder(s3: S3, uploaded: tuple[Path, str], tmp_path: Path) -> None:
    from imgcls.data.shards.formats import read_records

    local, url = uploaded
    here = open_shard_set(_data_cfg(str(local), tmp_path, {}))
    there = open_shard_set(_data_cfg(url, tmp_path, s3.options))
    assert there.classes == here.classes and there.label_base == here.label_base
    for split in ("train", "val"):
        assert [s.count for s in there.splits[split]] == [s.count for s in here.splits[split]]
        assert [s.url for s in there.splits[split]] == [f"{url}/{Path(s.url).name}" for s in here.splits[split]]
        for near, far in zip(here.splits[split], there.splits[split]):
            copy = remote.local_copy(far.url, str(tmp_path), s3.options)
            assert list(read_records("webdataset", Path(copy).read_bytes())) == list(
                read_records("webdataset", Path(near.url).read_bytes())
            )

    bare = open_shard_set(_data_cfg(f"s3://{BUCKET}/bare", tmp_path, s3.options, num_classes=3))
    assert {k: [s.count for s in v] for k, v in bare.splits.items()} == {
        k: [s.count for s in v] for k, v in here.splits.items()
    }, "counts from a scan of the downloaded shards"


def test_a_pipe_root_reads_as_its_local_folder(uploaded: tuple[Path, str], tmp_path: Path) -> None:

    local, _ = uploaded
    here = open_shard_set(_data_cfg(str(local), tmp_path, {}))
    there = open_shard_set(_data_cfg(f"pipe:cat {local}", tmp_path, {}))
    assert [s.count for s in there.splits["train"]] == [s.count for s in here.splits["train"]]
    first = there.splits["train"][0].url
    assert first == f"pipe:cat {local}/{Path(here.splits['train'][0].url).name}"
    assert (
        Path(remote.local_copy(first, str(tmp_path), {})).read_bytes() == Path(here.splits["train"][0].url).read_bytes()
    )


def test_an_http_root_reads_as_its_local_folder(uploaded: tuple[Path, str], tmp_path: Path) -> None:
    """Python's own file server: HTML index pages for listings, no Range support (a plain 200 for a ranged GET)."""
    import functools

    local, _ = uploaded
    handler = functools.partial(_QuietFiles, directory=str(local.parent))
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        root = f"http://127.0.0.1:{server.server_address[1]}/{local.name}"
        assert remote.list_names(root, {}) == sorted(p.name for p in local.iterdir())
        here = open_shard_set(_data_cfg(str(local), tmp_path, {}))
        there = open_shard_set(_data_cfg(root, tmp_path, {}))
        for near, far in zip(here.splits["val"], there.splits["val"]):
            assert Path(remote.local_copy(far.url, str(tmp_path), {})).read_bytes() == Path(near.url).read_bytes()
            assert far.count == near.count
    finally:
        server.shutdown()


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.slow
def test_train_from_a_bucket_as_from_the_local_shards(s3: S3, uploaded: tuple[Path, str], tmp_path: Path) -> None:
    """train.py debug=tiny on s3://BUCKET/wds (a subprocess, S3 endpoint and keys as a MinIO user gives them),
    and in this process on the local folder it was uploaded from, side by side: the same losses and val
    top-1."""
    from imgcls.run.train import run

    local, url = uploaded
    cache = tmp_path / "cache"
    common = ["data.format=webdataset", "recipe.epochs=1", "recipe.warmup_epochs=0", f"data.shard_cache={cache}"]
    shards = sorted(p.name for p in local.glob("*.tar"))
    gets_before = [s3.requests.gets(f"wds/{name}") for name in shards]
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    with ThreadPoolExecutor(1) as pool:
        s3_run = pool.submit(
            run_cli,
            "train.py",
            *tiny_overrides(
                url, *common, f"run_dir={tmp_path / 's3'}", f"+data.storage_options.endpoint_url={s3.endpoint}"
            ),
            env=env,
            timeout=300,
        )
        run(compose_config(tiny_overrides(local, *common), run_dir=tmp_path / "local"))
        proc = s3_run.result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = ("train.loss", "val.loss", "val.top1")
    local_epochs, s3_epochs = (
        [{k: e[k] for k in keys} for e in read_report(tmp_path / n)["epochs"]] for n in ("local", "s3")
    )
    assert s3_epochs == local_epochs and len(s3_epochs) == 1
    assert sorted(p.name for p in (cache / "remote" / "s3" / BUCKET / "wds").glob("*.tar")) == shards
    gets = [s3.requests.gets(f"wds/{name}") - before for name, before in zip(shards, gets_before)]
    assert gets == [1] * len(shards), "each shard is downloaded once (then read from data.shard_cache)"
