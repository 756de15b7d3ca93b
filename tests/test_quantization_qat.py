"""recipe=qat: a trained checkpoint fine-tuned with fake INT8 quantizers (NVIDIA Model Optimizer), a checkpoint that
evaluate / export read back, and a Q/DQ ONNX export that ONNX Runtime runs like the PyTorch network."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import imgcls.train
from imgcls.errors import ConfigError
from imgcls.export import run as export
from imgcls.models.trained import load_trained
from imgcls.quantization import qat
from imgcls.quantization.calibration import calibration_batches
from tests.conftest import compose_config, tiny_overrides, tiny_run

# find_spec, not importorskip: importing modelopt costs each xdist worker ~3 s at collection, and only the worker
# that runs this file needs it.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("modelopt") is None, reason="recipe=qat needs nvidia-modelopt (the export extra)"
)

QAT_OVERRIDES = (
    "recipe=qat",
    "recipe.epochs=1",
    "recipe.warmup_epochs=0",
    "recipe.qat.calibration_images=24",
    "recipe.qat.calibration_batch_size=8",
)


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    return tiny_run(tmp_path_factory, image_folder)


@pytest.fixture(scope="module")
def qat_run(fp32_run: Path, image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("qat-run")
    weights = fp32_run / "checkpoints" / "last.ckpt"
    cfg = compose_config(tiny_overrides(image_folder, *QAT_OVERRIDES, f"model.weights={weights}"), run_dir=run_dir)
    imgcls.train.run(cfg)
    return run_dir


def _val_batch(image_folder: Path, preprocessing: dict) -> torch.Tensor:
    """The val images (real JPEGs), preprocessed as deployment does; calibration_batches reads the train split, so
    its folder argument points at a root whose train/ is our val/."""
    root = image_folder.parent / f"{image_folder.name}-val-as-train"
    if not root.exists():
        root.mkdir()
        (root / "train").symlink_to(image_folder / "val")
    data = compose_config(tiny_overrides(root)).data
    return torch.cat(list(calibration_batches(data, preprocessing, 10_000, 64)))


@pytest.mark.slow
def test_qat_fine_tunes_the_trained_network_with_calibrated_quantizers(fp32_run: Path, qat_run: Path) -> None:
    blob = torch.load(qat_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert qat.STATE_KEY in blob  # what load_trained needs to rebuild the quantizers
    state = blob["state_dict"]
    weight_ranges = {k: v for k, v in state.items() if k.endswith(".weight_quantizer._amax")}
    input_ranges = {k: v for k, v in state.items() if k.endswith(".input_quantizer._amax")}
    assert len(weight_ranges) > 10 and {k.replace("weight", "input") for k in weight_ranges} <= input_ranges.keys()
    for key, amax in weight_ranges.items():  # per output channel, calibrated
        assert amax.numel() == state[key.replace("_quantizer._amax", "")].shape[0] and bool((amax > 0).all()), key
    assert all(amax.numel() == 1 for amax in input_ranges.values())  # activations: per tensor
    # The fine-tuning started from model.weights (not from a fresh init) and moved it a little (LR 5e-5 / 256).
    before = torch.load(fp32_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    change = max((state[k] - before[k]).abs().max().item() for k in before if k.endswith(".weight") and k in state)
    assert 0 < change < 1e-2


@pytest.mark.slow
def test_qat_checkpoint_loads_exports_to_qdq_onnx_and_runs_in_onnxruntime(
    fp32_run: Path, qat_run: Path, image_folder: Path, tmp_path: Path
) -> None:
    import onnx
    import onnxruntime as ort

    ckpt = qat_run / "checkpoints" / "last.ckpt"
    trained = load_trained(ckpt)
    assert qat.is_quantized(trained.net)
    images = _val_batch(image_folder, trained.preprocessing)
    with torch.inference_mode():
        fake_quant = trained.net(images).numpy()
        fp32 = load_trained(fp32_run / "checkpoints" / "last.ckpt").net(images).numpy()
    # INT8 rounding changes the logits a little, not the network: most predictions agree with the fp32 network.
    # (The tiny network's logits are small, so the relative error is large: measured 0.41 / 0.45 with 1 / 2
    # threads, which train slightly different networks. Predictions all agreed.)
    assert 0 < np.abs(fake_quant - fp32).mean() / np.abs(fp32).mean() < 1.0
    assert (fake_quant.argmax(1) == fp32.argmax(1)).mean() >= 0.8

    # A weights export of the QAT checkpoint reads back as the same quantized network.
    weights = tmp_path / "qat.pt"
    export(compose_config([f"ckpt={ckpt}", "format=weights", f"output={weights}"], config_name="export"))
    with torch.inference_mode():
        assert torch.equal(load_trained(weights).net(images), torch.from_numpy(fake_quant))

    out = tmp_path / "qat.onnx"
    export(compose_config([f"ckpt={ckpt}", "format=onnx", f"output={out}"], config_name="export"))
    model = onnx.load(str(out))
    assert {"QuantizeLinear", "DequantizeLinear"} <= {node.op_type for node in model.graph.node}  # TensorRT's INT8
    meta = json.loads({p.key: p.value for p in model.metadata_props}["imgcls"])
    assert meta["quantization"]["method"] == "qat (recipe=qat, 1 epochs)" and meta["classes"] == trained.classes
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: images.numpy()})[0]
    assert (logits.argmax(1) == fake_quant.argmax(1)).mean() >= 0.95
    assert np.abs(logits - fake_quant).max() < 0.05 * np.abs(fake_quant).max()


def test_qat_without_trained_weights_is_one_line(image_folder: Path) -> None:
    from imgcls.config_checks import check_config

    with pytest.raises(ConfigError, match=r"^recipe=qat fine-tunes a trained network .*set model.weights=PATH"):
        check_config(compose_config(tiny_overrides(image_folder, "recipe=qat")))


@pytest.mark.slow
def test_two_process_qat_starts_every_rank_from_the_one_process_calibration(
    fp32_run: Path, qat_run: Path, image_folder: Path, tmp_path: Path
) -> None:
    """`train.py recipe=qat trainer.devices=2` (Lightning's launcher, gloo): each rank calibrates the same training
    images, so the ranges are those of a one-process run, bit for bit; the weight ranges are not trained (static
    scales), so the checkpoints' ranges must match exactly."""
    from tests.conftest import clean_env, run_cli
    from tests.test_distributed import TWO_PROCESSES

    weights = fp32_run / "checkpoints" / "last.ckpt"
    args = tiny_overrides(image_folder, *QAT_OVERRIDES, *TWO_PROCESSES, "trainer.devices=2", f"model.weights={weights}")
    result = run_cli("train.py", *args, f"hydra.run.dir={tmp_path}", env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    ranges = {}
    for name, run_dir in (("one", qat_run), ("two", tmp_path)):
        state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
        ranges[name] = {k: v for k, v in state.items() if k.endswith("_quantizer._amax")}
    assert len(ranges["two"]) > 20 and ranges["two"].keys() == ranges["one"].keys()
    assert all(torch.equal(ranges["one"][k], ranges["two"][k]) for k in ranges["one"])


@pytest.mark.slow
def test_int8_export_of_a_qat_checkpoint_requantizes_its_fine_tuned_weights_for_onnxruntime(
    qat_run: Path, image_folder: Path, tmp_path: Path
) -> None:
    """format=int8 on a QAT checkpoint: the fine-tuned float weights (fake quantizers off, so BN folds into the
    convs at export) through ORT's static quantization, whose Q/DQ placement ORT's CPU kernels fuse."""
    import onnx
    import onnxruntime as ort

    ckpt = qat_run / "checkpoints" / "last.ckpt"
    out = tmp_path / "qat_int8.onnx"
    overrides = [f"ckpt={ckpt}", "format=int8", f"output={out}", "calibration.images=24", "calibration.batch_size=8"]
    export(compose_config(overrides, config_name="export"))
    model = onnx.load(str(out))
    ops = [node.op_type for node in model.graph.node]
    assert "BatchNormalization" not in ops and ops.count("QuantizeLinear") > 0  # a float export, then ORT's Q/DQ
    meta = json.loads({p.key: p.value for p in model.metadata_props}["imgcls"])
    assert meta["quantization"]["fine_tuned"] == "qat (recipe=qat, 1 epochs)"
    assert meta["quantization"]["tool"].startswith("onnxruntime")
    trained = load_trained(ckpt)
    images = _val_batch(image_folder, trained.preprocessing)
    with torch.inference_mode():
        fake_quant = trained.net(images).numpy()
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: images.numpy()})[0]
    assert (logits.argmax(1) == fake_quant.argmax(1)).mean() >= 0.9


def test_calibration_runs_on_the_gpu_of_each_srun_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """srun sets SLURM_LOCALID, not LOCAL_RANK: every task used to calibrate on cuda:0 (structural: no GPU here)."""
    from imgcls.quantization import qat

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "3")
    assert qat.calibration_device() == torch.device("cuda", 3)
    monkeypatch.setenv("LOCAL_RANK", "5")  # Lightning's launcher and torchrun
    assert qat.calibration_device() == torch.device("cuda", 5)


@pytest.mark.parametrize("recipe", ["qat_efficientnet_b0", "qat_efficientnet_b4"])
def test_qat_recipes_keep_main_py_defaults_for_what_nvidias_quant_scripts_do_not_pass(recipe: str) -> None:
    """efficientnet-quant-b0/b4 scripts run quant_main.py with main.py's argument defaults (DeepLearningExamples
    729963dd PyTorch/Classification/ConvNets/main.py:101-104, 199-200, 206, 336-340): no label smoothing, no mixup,
    no AutoAugment, bilinear. The recipes used to inherit the EfficientNet training recipe (0.1, 0.2, AutoAugment,
    bicubic)."""
    from tests.conftest import compose_config

    cfg = compose_config([f"recipe={recipe}"]).recipe
    assert (cfg.label_smoothing, cfg.mixup, cfg.augment, cfg.interpolation) == (0.0, 0.0, None, "bilinear")
