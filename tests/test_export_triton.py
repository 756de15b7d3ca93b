"""imgcls.export format=triton: a Triton model repository, parsed with Triton's own protobuf definitions
(tritonclient's model_config_pb2), its model.onnx run by onnxruntime on real JPEGs, and the user mistakes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from google.protobuf import text_format
from omegaconf import OmegaConf
from PIL import Image

from imgcls.data.transforms import val_transform
from imgcls.errors import ConfigError
from imgcls.export import run as export
from imgcls.export.triton import check_repository, trtexec_usable
from imgcls.inference.trained import load_trained
from tests.conftest import assert_one_line_error, compose_config, run_clis, tiny_run
from tests.test_export import ONNX_MAX_ABS_DIFF

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    return tiny_run(tmp_path_factory, image_folder)


def _export(ckpt: Path, repo: Path, *overrides: str) -> dict:
    return export(compose_config([f"ckpt={ckpt}", "format=triton", f"repo={repo}", *overrides], config_name="export"))


def _config(model_dir: Path) -> model_config_pb2.ModelConfig:
    """Parsed independently of imgcls.export.triton.check_repository, as Triton's server would read it."""
    return text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def _preprocess(path: Path, resize: int, size: int, mean: list[float], std: list[float]) -> np.ndarray:
    """What the generated README tells a client to do, written from its numbers (not via imgcls's transforms)."""
    image = Image.open(path).convert("RGB")
    scale = resize / min(image.size)
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.BILINEAR)
    left, top = round((image.width - size) / 2), round((image.height - size) / 2)  # torchvision's CenterCrop
    array = np.asarray(image.crop((left, top, left + size, top + size)), np.float32) / 255.0
    return ((array - np.array(mean, np.float32)) / np.array(std, np.float32)).transpose(2, 0, 1)


@pytest.mark.slow
def test_triton_repository_parses_and_serves_jpegs_like_pytorch(
    trained: Path, image_folder: Path, tmp_path: Path
) -> None:
    import onnxruntime as ort

    ckpt = trained / "checkpoints" / "last.ckpt"
    repo = tmp_path / "models"
    (repo / "other_model" / "1").mkdir(parents=True)  # a model already in the repository: left alone
    (repo / "other_model" / "config.pbtxt").write_text('name: "other_model"\n')
    summary = _export(ckpt, repo, "name=tiny", "max_batch=8")
    model_dir = repo / "tiny"
    assert summary["output"] == str(model_dir) and summary["platform"] == "onnxruntime_onnx"
    assert sorted(p.name for p in repo.iterdir()) == ["other_model", "tiny"]  # no temp folder left behind
    assert (repo / "other_model" / "config.pbtxt").read_text() == 'name: "other_model"\n'

    config = _config(model_dir)
    assert config.name == "tiny" and config.platform == "onnxruntime_onnx" and config.max_batch_size == 8
    assert config.HasField("dynamic_batching") and not config.HasField("optimization")
    (inp,), (out,) = config.input, config.output
    assert (inp.name, model_config_pb2.DataType.Name(inp.data_type), list(inp.dims)) == (
        "images",
        "TYPE_FP32",
        [3, 32, 32],
    )
    assert (out.name, model_config_pb2.DataType.Name(out.data_type), list(out.dims)) == ("logits", "TYPE_FP32", [3])
    assert (model_dir / out.label_filename).read_text().splitlines() == ["class_0", "class_1", "class_2"]
    check_repository(model_dir)  # imgcls's own cross-check agrees

    # The ONNX graph as onnxruntime sees it matches the config: names, fp32, dims after a dynamic batch axis.
    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    (onnx_in,), (onnx_out,) = session.get_inputs(), session.get_outputs()
    assert (onnx_in.name, onnx_in.type, onnx_in.shape[1:]) == (inp.name, "tensor(float)", list(inp.dims))
    assert (onnx_out.name, onnx_out.type, onnx_out.shape[1:]) == (out.name, "tensor(float)", list(out.dims))
    assert isinstance(onnx_in.shape[0], str)  # symbolic: any batch up to max_batch_size

    # A client following the README (its resize / crop / mean / std) gets PyTorch's logits for real JPEGs.
    readme = (model_dir / "README.md").read_text()
    model = load_trained(ckpt)
    pre = model.preprocessing
    resize = int(32 / pre["val_crop_pct"])  # 36: timm's floor(image_size / crop_pct), as evaluate.py uses
    assert f"shorter side to {resize} pixels" in readme and "Center crop 32x32" in readme
    assert f"mean = {list(pre['mean'])}" in readme and f"std = {list(pre['std'])}" in readme
    jpegs = sorted((image_folder / "val").rglob("*.jpg"))
    batch = np.stack([_preprocess(p, resize, 32, pre["mean"], pre["std"]) for p in jpegs])
    # ...which is what evaluate.py feeds the network (so the README's numbers are the right ones).
    transform = val_transform(OmegaConf.create(pre))
    reference = torch.stack([transform(Image.open(p).convert("RGB")) for p in jpegs]).numpy()
    assert np.abs(batch - reference).max() < 1e-5
    got = session.run(None, {"images": batch})[0]
    with torch.no_grad():
        expected = model.net(torch.from_numpy(batch)).numpy()
    assert got.shape == (len(jpegs), 3)
    assert np.abs(got - expected).max() < ONNX_MAX_ABS_DIFF
    # The tiny model learnt the colour classes: the served logits classify the val JPEGs like PyTorch does.
    assert (got.argmax(1) == expected.argmax(1)).all()

    # The cross-check can fail: a config that disagrees with the graph is refused in one line.
    (model_dir / "config.pbtxt").write_text((model_dir / "config.pbtxt").read_text().replace("dims: [3]", "dims: [4]"))
    with pytest.raises(ConfigError, match=r"logits: config.pbtxt TYPE_FP32 \[-1, 4\], model.onnx TYPE_FP32 \[-1, 3\]"):
        check_repository(model_dir)


@pytest.mark.slow
def test_fp16_is_a_tensorrt_setting_and_the_engine_build_skips_without_cuda(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if trtexec_usable():
        pytest.skip("trtexec and a CUDA GPU are here: the engine would be built, not skipped")
    summary = _export(trained / "checkpoints" / "last.ckpt", tmp_path, "trt_precision=fp16", "tensorrt=true")
    model_dir = tmp_path / "test_resnet"  # name= defaults to the arch
    config = _config(model_dir)
    assert config.max_batch_size == 128 and config.platform == "onnxruntime_onnx"  # no plan was built
    (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "FP16"
    # fp16 happens inside TensorRT on the GPU: clients still send and receive fp32.
    assert [model_config_pb2.DataType.Name(t.data_type) for t in (*config.input, *config.output)] == ["TYPE_FP32"] * 2
    assert sorted(p.name for p in (model_dir / "1").iterdir()) == ["model.onnx"]
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("imgcls: note:")]
    assert summary["tensorrt_skipped"] and len(notes) == 1
    assert f"trtexec --onnx={model_dir}/1/model.onnx --saveEngine={model_dir}/1/model.plan" in notes[0]
    assert "--maxShapes=images:128x3x32x32 --fp16" in notes[0]


@pytest.mark.slow
def test_triton_user_mistakes_are_one_line_errors(trained: Path, tmp_path: Path) -> None:
    ckpt = trained / "checkpoints" / "last.ckpt"
    taken = tmp_path / "repo" / "mine"
    taken.mkdir(parents=True)
    (taken / "keep.txt").write_text("not imgcls's")
    # One real CLI process (exit 2, one stderr line, no traceback); the other cases in process (the same
    # ConfigError the CLI prints), since each process costs seconds of imports on a busy CPU.
    (result,) = run_clis(
        {"exists": ["-m", "imgcls.export", f"ckpt={ckpt}", "format=triton", f"repo={tmp_path / 'repo'}", "name=mine"]}
    ).values()
    assert_one_line_error(result, str(taken), "not empty")
    assert (taken / "keep.txt").read_text() == "not imgcls's" and sorted(taken.iterdir()) == [taken / "keep.txt"]
    cases = {
        "trt_precision=int8": "trt_precision=int8 is not allowed; use fp32, fp16",
        "name=a/b": "name=a/b must be a plain folder name",
        "max_batch=0": "max_batch=0 must be a positive integer",
        "tensorrt=maybe": "tensorrt=maybe must be true or false",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError) as error:
            _export(ckpt, tmp_path / "new", override)
        assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert not (tmp_path / "new").exists()  # refused before anything was written
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        (tmp_path / "file").write_text("")
        _export(ckpt, tmp_path / "file")


@pytest.mark.slow
def test_a_folder_filled_during_the_export_is_left_alone_with_one_line(trained: Path, tmp_path: Path) -> None:
    """Another export (or a user) fills the target between the emptiness check and the rename: the rename must
    not replace it, and the error is one StorageError line, not an OSError traceback. The filling happens inside
    the ONNX writer, the step between the two."""
    from imgcls.errors import StorageError
    from imgcls.export import export_onnx
    from imgcls.export.triton import write_repository

    repo = tmp_path / "repo"
    loaded = load_trained(trained / "checkpoints" / "last.ckpt")
    opts = {"repo": repo, "name": "tiny", "max_batch": 8, "precision": "fp32", "tensorrt": False}

    def write_while_someone_fills_the_target(path: Path) -> None:
        export_onnx(loaded, path)
        (repo / "tiny").mkdir()
        (repo / "tiny" / "theirs.txt").write_text("not imgcls's")

    with pytest.raises(StorageError, match=r"^could not publish .*tiny .*remove it or pass name=OTHER$"):
        write_repository(loaded, opts, write_while_someone_fills_the_target)
    assert (repo / "tiny" / "theirs.txt").read_text() == "not imgcls's"
    assert sorted(p.name for p in repo.iterdir()) == ["tiny"]  # our hidden build folder is gone too
