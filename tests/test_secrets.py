"""A storage credential reaches the data it opens and nothing else: no file of a run dir, a sweep dir, a checkpoint,
W&B's or submitit's files, and no console line (imgcls/redaction.py, run/hydra_files.py, cli.py)."""

from __future__ import annotations

import functools
import http.server
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from imgcls.redaction import (
    REDACTED,
    RedactingFilter,
    is_secret_key,
    redact,
    redact_override,
    redact_url,
    remember_secrets,
    secrets_to_environment,
)
from tests.conftest import make_image_folder, run_cli, tiny_overrides

SECRET = "Bearer FAKE-SECRET-7f3a9c"


def test_urls_lose_userinfo_and_query_wherever_they_are() -> None:
    assert redact_url("https://u:pw@h.example/x.tar?X-Amz-Signature=abc") == "https://***@h.example/x.tar?***"
    assert redact_url("pipe:curl -s https://h/x.tar?token=abc | cat") == "pipe:curl -s https://h/x.tar?*** | cat"
    assert redact_url("s3://bucket/key/x.tar") == "s3://bucket/key/x.tar"  # nothing secret: as written
    assert redact_url("/data/imagenet") == "/data/imagenet"


def test_credential_keys_of_fsspec_are_secret_and_imgcls_keys_are_not() -> None:
    for key in ("key", "secret", "token", "password", "sas_token", "account_key", "client_secret", "Authorization"):
        assert is_secret_key(key), key
    for key in ("anon", "endpoint_url", "client_kwargs", "config_kwargs", "max_concurrency", "root", "monitor"):
        assert not is_secret_key(key), key


def test_a_config_and_an_override_are_redacted_not_changed() -> None:
    config = {"data": {"root": "https://u:pw@h/x", "storage_options": {"key": "AKIA", "anon": False}}}
    assert redact(config) == {"data": {"root": "https://***@h/x", "storage_options": {"key": REDACTED, "anon": False}}}
    assert config["data"]["storage_options"]["key"] == "AKIA"
    assert redact_override("+data.storage_options.secret=abc") == f"+data.storage_options.secret={REDACTED}"
    assert redact_override("recipe.epochs=3") == "recipe.epochs=3"


def test_a_typed_credential_leaves_argv_for_the_environment() -> None:
    env: dict[str, str] = {}
    argv = ["+data.storage_options.secret=abc123", "data.root='https://u:pw@h/x'", "seed=1,2", "model=resnet50"]
    assert secrets_to_environment(argv, env) == [
        "+data.storage_options.secret=${oc.env:IMGCLS_SECRET_DATA_STORAGE_OPTIONS_SECRET}",
        "data.root=${oc.env:IMGCLS_SECRET_DATA_ROOT}",
        "seed=1,2",
        "model=resnet50",
    ]
    assert env == {"IMGCLS_SECRET_DATA_STORAGE_OPTIONS_SECRET": "abc123", "IMGCLS_SECRET_DATA_ROOT": "https://u:pw@h/x"}


def test_a_log_line_that_quotes_a_secret_prints_stars() -> None:
    remember_secrets({"data": {"storage_options": {"secret": "quoted-secret-42"}}})
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "options %s", ({"secret": "quoted-secret-42"},), None)
    assert RedactingFilter().filter(record)
    assert record.getMessage() == "options {'secret': '***'}"


class _NeedsToken(http.server.SimpleHTTPRequestHandler):
    """Files served only to a request carrying SECRET as its Authorization header (as a private bucket)."""

    seen: list[str]

    def _allowed(self) -> bool:
        self.seen.append(self.headers.get("Authorization") or "")
        if self.headers.get("Authorization") == SECRET:
            return True
        self.send_error(401)
        return False

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self._allowed():
            super().do_GET()

    def do_HEAD(self) -> None:  # noqa: N802
        if self._allowed():
            super().do_HEAD()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def private_shards(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    from imgcls.data.shards.convert import convert

    www = tmp_path / "www"
    folder = make_image_folder(tmp_path / "images", classes=2, train_per_class=4, val_per_class=2)
    convert(folder, www / "wds", "webdataset", shard_size=8, progress=False)
    seen: list[str] = []
    handler = functools.partial(type("Handler", (_NeedsToken,), {"seen": seen}), directory=str(www))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/wds", seen
    finally:
        server.shutdown()


def _files_holding(folder: Path, text: str) -> list[str]:
    needle = text.encode()
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes())


@pytest.mark.slow
def test_a_typed_credential_is_in_no_file_of_a_submitit_sweep(
    private_shards: tuple[str, list[str]], tmp_path: Path
) -> None:
    """A sweep on submitit's local launcher (what hydra/launcher=slurm runs, on this machine) reads a private
    bucket with the token typed on the command line: the job reaches the data with it (the server saw it), and no
    file of the sweep dir (multirun.yaml, results.csv, submitit's pickles and logs, the run dir's config.yaml,
    .hydra/, log, checkpoints, CSV and W&B files) nor any console line holds it."""
    url, seen = private_shards
    sweep = tmp_path / "sweep"
    args = [
        *tiny_overrides(Path("unused"), "recipe.epochs=1", "logger=wandb", f"hydra.sweep.dir={sweep}"),
        f"data.root={url}", "data.format=webdataset", f"data.shard_cache={tmp_path / 'cache'}",
        f"+data.storage_options.client_kwargs.headers.Authorization='{SECRET}'",
        "hydra/launcher=submitit_local", "seed=1",
    ]  # fmt: skip
    result = run_cli("train.py", "-m", *args, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert seen and set(seen) == {SECRET}, "the job asked for the shards with the token"
    assert (sweep / ".submitit").is_dir() and (sweep / "0" / "wandb").is_dir()
    assert _files_holding(sweep, SECRET) == []
    assert _files_holding(sweep, SECRET.split()[-1]) == []
    assert SECRET.split()[-1] not in result.stdout + result.stderr
    stored = torch.load(sweep / "0" / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]
    assert stored["run_config"]["data"]["storage_options"]["client_kwargs"]["headers"]["Authorization"] == REDACTED


@pytest.mark.slow
def test_a_credential_in_the_users_yaml_is_in_no_file_imgcls_or_hydra_writes(
    image_folder: Path, tmp_path: Path
) -> None:
    """A credential written in the user's own config group: Hydra's .hydra/ files, config.yaml, the log, the
    checkpoint and report.json show *** (the user's YAML is theirs, and stays as it is)."""
    mine = tmp_path / "conf" / "creds"
    mine.mkdir(parents=True)
    (mine / "s3.yaml").write_text("# @package data\nstorage_options:\n  secret: yaml-secret-51c2\n")
    run_dir = tmp_path / "run"
    result = run_cli(
        "train.py", "--config-dir", str(tmp_path / "conf"), "+creds=s3",
        *tiny_overrides(image_folder, "recipe.epochs=1", f"hydra.run.dir={run_dir}"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert _files_holding(run_dir, "yaml-secret-51c2") == []
    assert "yaml-secret-51c2" not in result.stdout + result.stderr
    assert "yaml-secret-51c2" in (mine / "s3.yaml").read_text()


def test_a_credential_in_yaml_is_refused_under_submitit(image_folder: Path, tmp_path: Path) -> None:
    """submitit pickles the config for its jobs: a credential written in YAML would be copied into the sweep folder.
    One line before anything is launched; nothing written."""
    mine = tmp_path / "conf" / "creds"
    mine.mkdir(parents=True)
    (mine / "s3.yaml").write_text("# @package data\nstorage_options:\n  token: yaml-token-90ab\n")
    sweep = tmp_path / "sweep"
    result = run_cli(
        "train.py", "-m", "--config-dir", str(tmp_path / "conf"), "+creds=s3", "hydra/launcher=submitit_local",
        *tiny_overrides(image_folder, f"hydra.sweep.dir={sweep}"), "seed=1,2",
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "imgcls: error: data.storage_options.token holds a credential that submitit would write into the sweep "
        )
    )
    assert "Traceback" not in result.stderr
    assert not sweep.exists() or _files_holding(sweep, "yaml-token-90ab") == []
