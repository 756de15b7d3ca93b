"""INT8 post-training quantization (export format=int8), the calibration images, and ONNX models (fp32 and INT8)
in classify, evaluate.py and the inference benchmark, on the real JPEG folder and tiny checkpoint of the suite."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from onnx import numpy_helper
from PIL import Image

from imgcls.bench.inference import markdown_table
from imgcls.bench.inference import run as benchmark
from imgcls.data.transforms import val_transform
from imgcls.errors import CheckpointError, ConfigError, DataError
from imgcls.export import run as export
from imgcls.inference.onnx_model import load_onnx
from imgcls.inference.trained import load_trained
from imgcls.quantization.calibration import calibration_batches, spread_pick
from imgcls.run.evaluate import run as evaluate
from tests.conftest import assert_one_line_error, compose_config, make_image_folder, read_report, run_clis, tiny_run

# Share of the tiny model's train + val images (66) on which INT8 and fp32 pick the same class. Measured: all of
# them; a quantization with wrong scales or an unquantized-but-broken graph picks about one in three (3 classes).
MIN_AGREEMENT = 0.95


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    return tiny_run(tmp_path_factory, image_folder)


@pytest.fixture(scope="module")
def models(trained: Path, image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny checkpoint (copied, so that default outputs land in a folder of this test) and its fp32 and INT8
    ONNX exports, the INT8 one at the default path beside the checkpoint."""
    folder = tmp_path_factory.mktemp("int8")
    ckpt = folder / "tiny.ckpt"
    shutil.copy(trained / "checkpoints" / "last.ckpt", ckpt)
    export(compose_config([f"ckpt={ckpt}", "format=onnx"], config_name="export"))
    summary = export(
        compose_config(
            [f"ckpt={ckpt}", "format=int8", "calibration.images=40", f"data.root={image_folder}"], config_name="export"
        )
    )
    assert summary["output"] == str(folder / "tiny_int8.onnx")  # the default: <stem>_int8.onnx beside ckpt
    assert summary["quantization"]["calibration_images"] == 40
    return {"ckpt": ckpt, "fp32": folder / "tiny.onnx", "int8": folder / "tiny_int8.onnx"}


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


@pytest.mark.slow
def test_int8_model_is_qdq_with_int8_per_channel_symmetric_weights(models: dict[str, Path]) -> None:
    model = onnx.load(str(models["int8"]))
    inits = _initializers(model)
    producers = {out: node for node in model.graph.node for out in node.output}
    ops = [n.op_type for n in model.graph.node]
    layers = sum(isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) for m in load_trained(models["ckpt"]).net.modules())
    convs = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm")]
    assert len(convs) == layers  # every convolution (BN folded into it) and the classifier
    assert ops.count("QuantizeLinear") >= layers - 1 and ops.count("DequantizeLinear") >= 2 * (layers - 1)
    for conv in convs:
        activation, weight = producers[conv.input[0]], producers[conv.input[1]]
        assert activation.op_type == weight.op_type == "DequantizeLinear"  # both inputs arrive quantized
        values, scale, zero = (inits[name] for name in weight.input)
        assert values.dtype == np.int8 and zero.dtype == np.int8 and not zero.any()  # int8, symmetric
        out_channels = values.shape[0] if conv.op_type == "Conv" else 3  # the classifier: one per class
        assert scale.shape == (out_channels,) and out_channels > 1  # a scale per output channel
        act_scale, act_zero = (inits[name] for name in activation.input[1:])
        assert act_scale.shape == () and act_zero.dtype == np.int8 and act_zero == 0  # int8 symmetric activations
    meta = json.loads({p.key: p.value for p in model.metadata_props}["imgcls"])
    assert meta["classes"] == ["class_0", "class_1", "class_2"] and meta["preprocessing"]["image_size"] == 32
    note = meta["quantization"]
    assert note["method"] == "percentile" and note["percentile"] == 99.99 and note["calibration_images"] == 40
    assert note["activations"] == "int8 symmetric" and note["weights"] == "int8 symmetric per-channel"


@pytest.mark.slow
def test_uint8_activations_for_onnxruntime_cpu(models: dict[str, Path], image_folder: Path, tmp_path: Path) -> None:
    """calibration.activations=uint8: asymmetric uint8 activations (ORT CPU's fully fused kernels), int8 weights."""
    out = tmp_path / "u8.onnx"
    export(compose_config([f"ckpt={models['ckpt']}", "format=int8", "calibration.activations=uint8",
                           "calibration.images=24", f"output={out}", f"data.root={image_folder}"],
                          config_name="export"))  # fmt: skip
    model = onnx.load(str(out))
    inits = _initializers(model)
    activation_zero_points = [inits[n.input[2]] for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert activation_zero_points and all(z.dtype == np.uint8 for z in activation_zero_points)
    weights = [inits[n.input[0]] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert any(w.dtype == np.int8 and w.ndim == 4 for w in weights)
    u8, fp32 = load_onnx(out), load_onnx(models["fp32"])
    assert u8.quantization["activations"] == "uint8 asymmetric" and u8.quantization["calibration_images"] == 24
    images, _ = _images(image_folder, u8.preprocessing)
    assert (u8(images).argmax(1) == fp32(images).argmax(1)).mean() >= MIN_AGREEMENT


def _images(folder: Path, preprocessing: dict) -> tuple[torch.Tensor, list[Path]]:
    transform = val_transform(OmegaConf.create(preprocessing))
    paths = sorted(folder.rglob("*.jpg"))
    return torch.stack([transform(Image.open(p).convert("RGB")) for p in paths]), paths


@pytest.mark.slow
def test_int8_predictions_agree_with_fp32(models: dict[str, Path], image_folder: Path) -> None:
    fp32, int8 = load_onnx(models["fp32"]), load_onnx(models["int8"])
    assert (fp32.precision, int8.precision) == ("fp32", "int8") and int8.classes == fp32.classes
    images, _ = _images(image_folder, int8.preprocessing)
    with torch.inference_mode():
        torch_logits = load_trained(models["ckpt"]).net(images).numpy()
    fp32_logits, int8_logits = fp32(images), int8(images)
    assert np.abs(fp32_logits - torch_logits).max() < 1e-4  # the fp32 export is the checkpoint's network
    agreement = (fp32_logits.argmax(1) == int8_logits.argmax(1)).mean()
    assert agreement >= MIN_AGREEMENT, agreement
    # INT8 logits follow the fp32 ones closely, not only in their argmax (a wrong scale would scale them).
    error = np.abs(int8_logits - fp32_logits).mean() / np.abs(fp32_logits).mean()
    assert error < 0.2, error
    assert not np.array_equal(int8_logits, fp32_logits)  # and they do come from another (quantized) graph


def _data_cfg(root: Path, **extra: object) -> DictConfig:
    # The keys a composed data config always has (conf/data/_base.yaml's values) that calibration reads.
    return OmegaConf.create({"root": str(root), "format": "folder", "num_workers": 0, "on_bad_image": "skip", **extra})


def test_calibration_is_spread_over_classes_seeded_and_val_preprocessed(image_folder: Path) -> None:
    preprocessing = tiny_preprocessing()
    batches = list(calibration_batches(_data_cfg(image_folder), preprocessing, images=7, batch_size=3, seed=0))
    assert [len(b) for b in batches] == [3, 3, 1] and batches[0].dtype == torch.float32
    assert batches[0].shape[1:] == (3, 32, 32)
    again = list(calibration_batches(_data_cfg(image_folder), preprocessing, images=7, batch_size=3, seed=0))
    other = list(calibration_batches(_data_cfg(image_folder), preprocessing, images=7, batch_size=3, seed=1))
    assert all(torch.equal(a, b) for a, b in zip(batches, again))
    assert not torch.equal(torch.cat(batches), torch.cat(other))
    # Which files: the first picks cover every class (16 train files per class, class_0's first)...
    from torchvision.datasets import ImageFolder

    samples = ImageFolder(str(image_folder / "train")).samples
    order = spread_pick([t for _, t in samples], seed=0)
    assert sorted(samples[i][1] for i in order[:6]) == [0, 0, 1, 1, 2, 2]
    assert sorted(order) == list(range(len(samples))) and order[:7] != list(range(7))
    # ...and they are read with the val transform (resize + centre crop + normalize), not a training augmentation.
    transform = val_transform(OmegaConf.create(preprocessing))
    expected = torch.stack([transform(Image.open(samples[i][0]).convert("RGB")) for i in order[:7]])
    assert torch.equal(torch.cat(batches), expected)


def tiny_preprocessing() -> dict:
    """The val preprocessing of the tiny run (debug=tiny: 32 px)."""
    data = compose_config(["debug=tiny", "data.root=/unused"]).data
    return {k: OmegaConf.select(data, k) for k in ("image_size", "val_crop_pct", "val_crop_padding", "interpolation",
                                                   "mean", "std")}  # fmt: skip


def test_calibration_bad_images_follow_the_policy(tmp_path: Path) -> None:
    root = make_image_folder(tmp_path / "data", classes=2, train_per_class=3, val_per_class=1)
    (root / "train" / "class_0" / "000.jpg").write_bytes(b"not a jpeg")
    preprocessing = tiny_preprocessing()
    got = list(calibration_batches(_data_cfg(root), preprocessing, images=5, batch_size=2))
    assert sum(len(b) for b in got) == 5  # the bad file is skipped and the next pick takes its place
    with pytest.raises(DataError, match="000.jpg is not a decodable image"):
        list(calibration_batches(_data_cfg(root, on_bad_image="error"), preprocessing, images=6, batch_size=6))
    with pytest.raises(ConfigError, match="calibration.images=0"):
        calibration_batches(_data_cfg(root), preprocessing, images=0, batch_size=2)
    with pytest.raises(ConfigError, match="data.format=webdataset: calibration reads a folder"):
        calibration_batches(_data_cfg(root, format="webdataset"), preprocessing, images=2, batch_size=2)


@pytest.mark.slow
def test_evaluate_an_onnx_model_like_a_checkpoint(models: dict[str, Path], trained: Path, image_folder: Path,
                                                  tmp_path: Path) -> None:  # fmt: skip
    last_row = read_report(trained)["epochs"][-1]
    results = {}
    for name in ("fp32", "int8"):
        cfg = compose_config(
            [f"ckpt={models[name]}", f"data.root={image_folder}"], config_name="evaluate", run_dir=tmp_path / name
        )
        results[name] = evaluate(cfg)
        written = json.loads((tmp_path / name / "eval.json").read_text())
        assert written["precision"] == name and written["backend"] == "onnxruntime"
        assert written["val.total_ips"] > 0 and written["val.compute_ips"] >= written["val.total_ips"]
    # fp32 ONNX: the numbers the training run logged for the same weights and val images.
    assert results["fp32"]["val.top1"] == pytest.approx(last_row["val.top1"])
    assert results["fp32"]["val.top5"] == pytest.approx(last_row["val.top5"])
    assert results["fp32"]["val.loss"] == pytest.approx(last_row["val.loss"], rel=1e-4)
    assert abs(results["int8"]["val.top1"] - results["fp32"]["val.top1"]) <= 100 / 18  # at most one of 18 images
    assert results["int8"]["val.top1"] >= 90
    assert json.loads((tmp_path / "int8" / "eval.json").read_text())["quantization"]["method"] == "percentile"


@pytest.mark.slow
def test_onnx_errors_in_evaluate(models: dict[str, Path], tmp_path: Path) -> None:
    def run(*overrides: str) -> None:
        evaluate(compose_config(list(overrides), config_name="evaluate", run_dir=tmp_path))

    with pytest.raises(DataError, match="data.root=PATH is required to evaluate the ONNX file"):
        run(f"ckpt={models['int8']}")
    other = make_image_folder(tmp_path / "four", classes=4, train_per_class=1, val_per_class=1)
    with pytest.raises(DataError, match="has 4 classes that differ from the 3 of ckpt="):
        run(f"ckpt={models['int8']}", f"data.root={other}")
    (tmp_path / "fake.onnx").write_text("not onnx")
    with pytest.raises(CheckpointError, match="fake.onnx is not a readable ONNX model"):
        run(f"ckpt={tmp_path / 'fake.onnx'}", f"data.root={other}")
    stripped = onnx.load(str(models["fp32"]))
    del stripped.metadata_props[:]
    onnx.save(stripped, str(tmp_path / "bare.onnx"))
    with pytest.raises(CheckpointError, match="bare.onnx has no imgcls metadata"):
        run(f"ckpt={tmp_path / 'bare.onnx'}", f"data.root={other}")


@pytest.mark.slow
def test_benchmark_times_onnxruntime_with_the_torch_table(models: dict[str, Path], tmp_path: Path, capsys) -> None:
    common = ["mode=benchmark", "batch_sizes=[1,4]", "benchmark.warmup=1", "benchmark.iterations=3"]
    docs = {}
    for name in ("ckpt", "int8"):
        cfg = compose_config([*common, f"ckpt={models[name]}"], config_name="evaluate", run_dir=tmp_path / name)
        docs[name] = benchmark(cfg)
    assert docs["ckpt"]["backend"] == "torch" and docs["int8"]["backend"] == "onnxruntime"
    assert docs["int8"]["precision"] == "int8" and docs["int8"]["threads"] == torch.get_num_threads()
    assert docs["int8"]["image_size"] == 32
    rows = docs["int8"]["rows"]
    assert [r["batch_size"] for r in rows] == [1, 4] and all(r["iterations"] == 3 for r in rows)
    assert set(rows[0]) == set(docs["ckpt"]["rows"][0])  # the same columns as the PyTorch rows
    assert all(0 < r["latency_avg_ms"] <= r["latency_p99_ms"] for r in rows)
    assert json.loads((tmp_path / "int8" / "benchmark.json").read_text())["rows"] == rows
    assert markdown_table(rows) in capsys.readouterr().out


@pytest.mark.slow
def test_int8_export_errors(models: dict[str, Path], tmp_path: Path) -> None:
    def run(*overrides: str) -> None:
        export(compose_config(list(overrides), config_name="export"))

    ckpt = models["ckpt"]
    with pytest.raises(ConfigError, match="calibration.method=kl must be one of percentile, minmax, entropy"):
        run(f"ckpt={ckpt}", "format=int8", "calibration.method=kl")
    with pytest.raises(ConfigError, match="calibration.batch_size=0 must be a positive integer"):
        run(f"ckpt={ckpt}", "format=int8", "calibration.batch_size=0")
    weights = tmp_path / "tiny.pt"
    run(f"ckpt={ckpt}", "format=weights", f"output={weights}")
    with pytest.raises(DataError, match="format=int8 needs data.root=DIR"):  # a weights file has no data config
        run(f"ckpt={weights}", "format=int8")
    before = models["int8"].read_bytes()
    with pytest.raises(ConfigError, match="tiny_int8.onnx .the default beside ckpt. already exists; pass output=PATH"):
        run(f"ckpt={ckpt}", "format=int8")
    assert models["int8"].read_bytes() == before
    with pytest.raises(DataError, match="data.root=/nonexistent does not exist"):
        run(f"ckpt={ckpt}", "format=int8", "data.root=/nonexistent", f"output={tmp_path / 'x.onnx'}")
    assert not (tmp_path / "tiny_int8.onnx").exists() and not (tmp_path / "x.onnx").exists()


@pytest.fixture(scope="module")
def cli(models: dict[str, Path], image_folder: Path) -> dict[str, subprocess.CompletedProcess]:
    """Two real command lines (most of each is Python's import time, so only two): classify on the INT8 file,
    and an export error that must be one line with exit code 2."""
    return run_clis(
        {
            "classify": ["-m", "imgcls.classify", f"ckpt={models['int8']}", "backend=onnx",
                         f"images=[{image_folder / 'val'}]", "--json"],
            "images0": ["-m", "imgcls.export", f"ckpt={models['ckpt']}", "format=int8", "calibration.images=0"],
        }
    )  # fmt: skip


@pytest.mark.slow
def test_cli_classify_runs_the_int8_model(cli: dict, models: dict[str, Path], image_folder: Path) -> None:
    classify = cli["classify"]
    assert classify.returncode == 0, classify.stderr[-2000:]
    results = json.loads(classify.stdout)
    assert len(results) == 18
    # The top class of the CLI is the one the INT8 session gives for the same file (the val preprocessing).
    model = load_onnx(models["int8"])
    images, paths = _images(image_folder / "val", model.preprocessing)
    top = [model.classes[i] for i in model(images).argmax(1)]
    assert [r["top"][0]["class"] for r in results] == top
    assert [r["path"] for r in results] == [str(p) for p in paths]
    assert sum(r["top"][0]["class"] == Path(r["path"]).parent.name for r in results) >= 16  # and it is right


@pytest.mark.slow
def test_cli_export_error_is_one_line(cli: dict) -> None:
    assert_one_line_error(cli["images0"], "calibration.images=0 must be a positive integer")
