"""imgcls.export: weights (+EMA) / ONNX / TorchScript, and timm / torchvision state_dicts via model.weights=."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from imgcls.data.transforms import val_transform
from imgcls.errors import CheckpointError
from imgcls.export import run as export
from imgcls.inference.trained import load_trained
from imgcls.models.factory import build_network
from tests.conftest import assert_one_line_error, compose_config, run_clis, sample_photos, tiny_run

# fp32 PyTorch vs onnxruntime on the same preprocessed photos: the largest logit difference allowed.
# Measured ~1e-6 for resnet18 (different kernels sum in different orders); 1e-4 leaves room
# for other CPUs while still catching any real mismatch (a wrong weight or op moves logits by >1e-2).
ONNX_MAX_ABS_DIFF = 1e-4


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    return tiny_run(tmp_path_factory, image_folder)


@pytest.fixture(scope="session")
def photos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Eight real photos (conftest.sample_photos)."""
    return sample_photos(tmp_path_factory.mktemp("photos"), 8)


def _export(ckpt: Path, out: Path, *overrides: str) -> dict:
    cfg = compose_config([f"ckpt={ckpt}", f"output={out}", *overrides], config_name="export")
    return export(cfg)


def _batch(paths: list[Path], preprocessing: dict) -> torch.Tensor:
    from PIL import Image

    transform = val_transform(OmegaConf.create(preprocessing))
    return torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])


@pytest.mark.slow
def test_onnx_export_runs_in_onnxruntime_like_pytorch(trained: Path, photos: list[Path], tmp_path: Path) -> None:
    import onnxruntime as ort

    ckpt = trained / "checkpoints" / "last.ckpt"
    _export(ckpt, tmp_path / "model.onnx", "format=onnx")
    model = load_trained(ckpt)
    images = _batch(photos, model.preprocessing)
    with torch.no_grad():
        expected = model.net(images).numpy()
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch in (images, images[:1], images[:3]):  # the batch axis is dynamic
        got = session.run(None, {"images": batch.numpy()})[0]
        assert got.shape == (len(batch), 3)
        assert np.abs(got - expected[: len(batch)]).max() < ONNX_MAX_ABS_DIFF
    meta = json.loads(session.get_modelmeta().custom_metadata_map["imgcls"])
    assert meta["classes"] == ["class_0", "class_1", "class_2"] and meta["image_size"] == 32
    assert session.get_modelmeta().custom_metadata_map and meta["preprocessing"]["val_crop_pct"] == 0.875


@pytest.mark.slow
def test_torchscript_export_matches(trained: Path, photos: list[Path], tmp_path: Path) -> None:
    ckpt = trained / "checkpoints" / "last.ckpt"
    _export(ckpt, tmp_path / "model.ts", "format=torchscript")
    extra = {"imgcls.json": ""}
    scripted = torch.jit.load(str(tmp_path / "model.ts"), _extra_files=extra)
    model = load_trained(ckpt)
    images = _batch(photos, model.preprocessing)
    with torch.no_grad():
        assert torch.allclose(scripted(images), model.net(images), atol=1e-5)
    assert json.loads(extra["imgcls.json"])["arch"] == "test_resnet"


@pytest.mark.slow
def test_weights_export_with_ema_and_model_weights(trained: Path, tmp_path: Path) -> None:
    ckpt = trained / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    _export(ckpt, tmp_path / "raw.pt")
    _export(ckpt, tmp_path / "ema.pt", "use_ema=true")
    raw = torch.load(tmp_path / "raw.pt", weights_only=False)
    ema = torch.load(tmp_path / "ema.pt", weights_only=False)
    assert raw["arch"] == "test_resnet" and raw["classes"] == ["class_0", "class_1", "class_2"] and not raw["ema"]
    assert raw["preprocessing"]["mean"] == [0.485, 0.456, 0.406] and raw["image_size"] == 32
    key = "layer1.0.conv1.weight"
    assert torch.equal(raw["state_dict"][key], state[f"net.{key}"])
    assert torch.equal(ema["state_dict"][key], state[f"ema.module.{key}"])  # NVIDIA's --ema was ignored
    assert not torch.equal(raw["state_dict"][key], ema["state_dict"][key]) and ema["ema"]
    # model.weights= (fine-tuning / evaluation) accepts the export: same tensors in the new network.
    overrides = ["model=resnet18", "model.arch=test_resnet", f"model.weights={tmp_path / 'ema.pt'}"]
    model_cfg = compose_config(overrides).model
    net = build_network(model_cfg, num_classes=3)
    assert torch.equal(net.state_dict()[key], ema["state_dict"][key])
    assert torch.equal(net.state_dict()["fc.weight"], ema["state_dict"]["fc.weight"])


@pytest.mark.slow
def test_torchvision_resnet50_state_dict_loads_into_timm_resnet50(tmp_path: Path) -> None:
    import torchvision

    reference = torchvision.models.resnet50(weights=None).eval()
    torch.save(reference.state_dict(), tmp_path / "tv_resnet50.pth")
    # The same key names, head `fc` in both (1000 classes): loaded as they are, and the forward agrees.
    net = build_network(compose_config(["model=resnet50", f"model.weights={tmp_path / 'tv_resnet50.pth'}"]).model, 1000)
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(net.eval()(images), reference(images), atol=1e-4)


def test_timm_state_dict_without_num_batches_tracked_loads(tmp_path: Path) -> None:
    import timm

    source = timm.create_model("efficientnet_b0", num_classes=1000)
    state = {k: v for k, v in source.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "timm_b0.pth")  # as timm's published files are
    net = build_network(
        compose_config(["model=efficientnet_b0", f"model.weights={tmp_path / 'timm_b0.pth'}"]).model, 1000
    )
    assert torch.equal(net.state_dict()["conv_stem.weight"], state["conv_stem.weight"])


def test_torchvision_efficientnet_is_a_clear_error(tmp_path: Path) -> None:
    import torchvision

    torch.save(torchvision.models.efficientnet_b0(weights=None).state_dict(), tmp_path / "tv_b0.pth")
    cfg = compose_config(["model=efficientnet_b0", f"model.weights={tmp_path / 'tv_b0.pth'}"]).model
    with pytest.raises(CheckpointError, match=r"\d+ missing .*'conv_stem.weight'.*, 360 unexpected .*'features.0.0"):
        build_network(cfg, 1000)


@pytest.mark.slow
def test_export_errors(trained: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw.pt"
    _export(trained / "checkpoints" / "last.ckpt", raw)
    with pytest.raises(CheckpointError, match="holds the raw weights; export with use_ema=true"):
        _export(raw, tmp_path / "x.onnx", "format=onnx", "use_ema=true")
    with pytest.raises(CheckpointError, match="nope.ckpt does not exist"):
        _export(tmp_path / "nope.ckpt", tmp_path / "x.pt")


@pytest.fixture(scope="module")
def cli(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("export-cli")
    ckpt = trained / "checkpoints" / "last.ckpt"
    return run_clis(
        {
            "bad_format": ["-m", "imgcls.export", f"ckpt={ckpt}", "format=tflite"],
            "ok": ["-m", "imgcls.export", f"ckpt={ckpt}", "format=onnx", "use_ema=true", f"output={tmp / 'ema.onnx'}"],
        }
    )


@pytest.mark.slow
def test_export_cli(cli: dict) -> None:
    assert_one_line_error(cli["bad_format"], "format=tflite must be one of weights, onnx, torchscript, int8, triton")
    ok = cli["ok"]
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "ema.onnx (onnx, test_resnet, 3 classes, ema weights)" in ok.stdout
