"""recipe=qat: a trained checkpoint fine-tuned with fake INT8 quantizers (NVIDIA Model Optimizer), a checkpoint that
evaluate / export read back, and a Q/DQ ONNX export that ONNX Runtime runs like the PyTorch network."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import imgcls.run.train
from imgcls.config.checks import check_config
from imgcls.errors import ConfigError
from imgcls.export import run as export
from imgcls.inference.trained import load_trained
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
    imgcls.run.train.run(cfg)
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
    from imgcls.config.checks import check_config

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
def test_two_process_qat_lists_the_training_split_on_one_rank(
    fp32_run: Path, image_folder: Path, tmp_path: Path
) -> None:
    """Calibration runs once the process group exists (ClassificationModule.configure_model): rank 0 walks the train
    split for the calibration and the training loader, rank 1 receives the lists and walks nothing (it walked the
    train split itself when calibration ran before the Trainer)."""
    from tests import warm_python
    from tests.conftest import ROOT, clean_env
    from tests.test_distributed import TWO_PROCESSES

    weights = fp32_run / "checkpoints" / "last.ckpt"
    args = tiny_overrides(image_folder, *QAT_OVERRIDES, *TWO_PROCESSES, "trainer.devices=2", f"model.weights={weights}")
    result = warm_python.run([ROOT / "tests" / "train_counting_walks.py", *args, f"hydra.run.dir={tmp_path / 'run'}"],
                             base_env={**clean_env(), "IMGCLS_TEST_WALKS": str(tmp_path)}, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rank0 = (tmp_path / "walks-rank0.txt").read_text().split()
    assert str(image_folder / "train") in rank0
    assert not (tmp_path / "walks-rank1.txt").exists(), (tmp_path / "walks-rank1.txt").read_text()


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
    overrides = [f"ckpt={ckpt}", "format=int8", f"output={out}", "calibration.images=24", "calibration.batch_size=8",
                 f"data.root={image_folder}"]  # fmt: skip
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


def _mock_gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> list[object]:
    """`count` GPUs as torch.cuda reports them (structural: no GPU here); the CUDA calls made, in order. The
    context-making calls a library would make on the current device are recorded too, and fail."""
    calls: list[object] = []

    def record(name: str, result: object = None) -> object:
        def call(*args: object) -> object:
            calls.append((name, *args) if args else name)
            if isinstance(result, BaseException):
                raise result
            return result

        return call

    monkeypatch.setattr(torch.cuda, "is_available", record("is_available", True))
    monkeypatch.setattr(torch.cuda, "device_count", record("device_count", count))
    monkeypatch.setattr(torch.cuda, "set_device", record("set_device"))
    for name in ("current_device", "init", "synchronize", "_lazy_init"):
        monkeypatch.setattr(torch.cuda, name, record(name, RuntimeError(f"torch.cuda.{name}: no GPU here")))
    return calls


@pytest.mark.parametrize("variable", ["SLURM_LOCALID", "LOCAL_RANK"])
def test_calibration_makes_the_gpu_of_each_task_current_before_any_cuda_work(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """srun sets SLURM_LOCALID, not LOCAL_RANK: every task used to calibrate on cuda:0. Calibration runs before the
    Trainer (so before Lightning sets the device): the task's GPU is made current before any CUDA work, else a
    library call on the current device makes a context on GPU 0 from every rank."""
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(variable, "3")
    calls = _mock_gpus(monkeypatch, 4)
    assert qat.calibration_device() == torch.device("cuda", 3)
    # The two queries that make no context, then the device, and nothing else.
    assert calls == ["is_available", "device_count", ("set_device", 3)]


def test_calibration_device_follows_the_launchers_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "3")
    calls = _mock_gpus(monkeypatch, 8)
    assert qat.calibration_device() == torch.device("cuda", 3)
    monkeypatch.setenv("LOCAL_RANK", "5")  # Lightning's launcher and torchrun
    assert qat.calibration_device() == torch.device("cuda", 5)
    calls.clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # srun --gpus-per-task=1: the task sees its own GPU
    assert qat.calibration_device() == torch.device("cuda", 0) and calls == ["is_available", ("set_device", 0)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert qat.calibration_device() == torch.device("cpu")


def test_quantize_makes_its_gpu_current_before_modelopt_or_the_network_touch_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _mock_gpus(monkeypatch, 4)

    def no_modelopt() -> None:
        calls.append("modelopt")
        raise RuntimeError("stop here: the network would move to the GPU next")

    monkeypatch.setattr(qat, "_modelopt", no_modelopt)
    net = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="stop here"):
        qat.quantize(net, [], torch.device("cuda", 3))
    assert calls == [("set_device", 3), "modelopt"] and net.weight.device.type == "cpu"


@pytest.fixture
def calibration_folder(tmp_path: Path) -> Path:
    """A small train split with what ImageFolder's walk orders: a nested folder, an upper-case extension, a
    file that is no image."""
    import shutil

    from tests.conftest import make_image_folder

    root = make_image_folder(tmp_path / "images", classes=4, train_per_class=5, val_per_class=1, size=(24, 20))
    (root / "train" / "class_1" / "sub").mkdir()
    shutil.copy(root / "train" / "class_3" / "000.jpg", root / "train" / "class_1" / "sub" / "aaa.jpg")
    shutil.copy(root / "train" / "class_0" / "001.jpg", root / "train" / "class_2" / "0005.JPG")
    (root / "train" / "class_0" / "notes.txt").write_text("not an image")
    return root


def _calibration(root: Path, images: int, batch_size: int, seed: int) -> torch.Tensor:
    from imgcls.inference.trained import preprocessing_of

    data = compose_config(tiny_overrides(root)).data
    return torch.cat(list(calibration_batches(data, preprocessing_of(data), images, batch_size, seed)))


def test_calibration_lists_the_train_split_once_through_made_once(
    calibration_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calibration reads the one-rank file list (distributed.made_once: rank 0 walks, the others receive it), as
    the training loader does, instead of an ImageFolder that walks the whole split (ImageNet: 1.28M files) on
    every rank."""
    import torchvision.datasets.folder

    from imgcls.data.file_list import FileList
    from imgcls.quantization import calibration

    def no_walk(*args: object, **kwargs: object) -> None:
        raise AssertionError("ImageFolder walked the split itself")

    monkeypatch.setattr(torchvision.datasets.folder, "make_dataset", no_walk)
    events: list[str] = []
    real_made_once = calibration.made_once

    def made_once(make: object) -> object:
        events.append("made_once")
        return real_made_once(make)

    class CountedFileList(FileList):
        def __init__(self, *args: object) -> None:
            events.append("walk")
            super().__init__(*args)

    datasets = []

    class SeenImageFolder(calibration.CheckedImageFolder):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            datasets.append(self)

    monkeypatch.setattr(calibration, "made_once", made_once)
    monkeypatch.setattr(calibration, "FileList", CountedFileList)
    monkeypatch.setattr(calibration, "CheckedImageFolder", SeenImageFolder)
    assert len(_calibration(calibration_folder, 9, 4, seed=0)) == 9
    assert events == ["made_once", "walk"]  # one walk, inside made_once
    assert len(datasets) == 1 and isinstance(datasets[0].files, CountedFileList) and len(datasets[0]) == 22


def test_a_rank_that_receives_the_file_list_walks_nothing(
    calibration_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under DDP the ranks other than 0 get the list from made_once: they neither list the class folders nor walk
    them, and calibrate on the same images."""
    import os

    from imgcls.data.file_list import FileList
    from imgcls.data.folder import classes_of
    from imgcls.quantization import calibration

    expected = _calibration(calibration_folder, 9, 4, seed=0)
    files = FileList(calibration_folder / "train", classes_of(calibration_folder, "train"))
    monkeypatch.setattr(calibration, "made_once", lambda make: files)  # what a rank other than 0 receives
    for name in ("walk", "scandir", "listdir"):

        def walked(*args: object, name: str = name) -> None:
            raise AssertionError(f"os.{name}{args} on a rank that received the file list")

        monkeypatch.setattr(os, name, walked)
    assert torch.equal(_calibration(calibration_folder, 9, 4, seed=0), expected)


@pytest.mark.parametrize(("images", "batch_size", "seed"), [(9, 4, 0), (22, 8, 1), (100, 3, 7)])
def test_calibration_picks_the_images_of_imagefolders_own_walk(
    calibration_folder: Path, images: int, batch_size: int, seed: int
) -> None:
    """The file list keeps ImageFolder's order and labels, so the calibration images and their order stay those
    the calibration read when it walked the split with an ImageFolder of its own (compared bit for bit with that
    code's batches when it changed, on a folder like this one and for these seeds)."""
    from imgcls.data.images import CheckedImageFolder
    from imgcls.data.transforms import val_transform
    from imgcls.inference.trained import preprocessing_of
    from imgcls.quantization.calibration import spread_pick

    data = compose_config(tiny_overrides(calibration_folder)).data
    transform = val_transform(OmegaConf.create(preprocessing_of(data)))
    walked = CheckedImageFolder(str(calibration_folder / "train"), transform=transform)  # ImageFolder's own walk
    order = spread_pick([t for _, t in walked.samples], seed)[:images]
    expected = torch.stack([walked[i][0] for i in order])
    assert torch.equal(_calibration(calibration_folder, images, batch_size, seed), expected)


@pytest.mark.parametrize("recipe", ["qat_efficientnet_b0", "qat_efficientnet_b4"])
def test_qat_recipes_keep_main_py_defaults_for_what_nvidias_quant_scripts_do_not_pass(recipe: str) -> None:
    """efficientnet-quant-b0/b4 scripts run quant_main.py with main.py's argument defaults (DeepLearningExamples
    729963dd PyTorch/Classification/ConvNets/main.py:101-104, 199-200, 206, 336-340): no label smoothing, no mixup,
    no AutoAugment, bilinear. The recipes used to inherit the EfficientNet training recipe (0.1, 0.2, AutoAugment,
    bicubic)."""
    from tests.conftest import compose_config

    cfg = compose_config([f"recipe={recipe}"]).recipe
    assert (cfg.label_smoothing, cfg.mixup, cfg.augment, cfg.interpolation) == (0.0, 0.0, None, "bilinear")


def _efficientnet(seed: int = 0) -> torch.nn.Module:
    """A 10-class EfficientNet-B0 as imgcls builds it (timm's blocks, NVIDIA's init), random weights."""
    from imgcls.models import build_network

    torch.manual_seed(seed)
    return build_network(compose_config(["model=efficientnet_b0"]).model, num_classes=10).eval()


def _batches(count: int = 2, size: int = 48) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(4, 3, size, size, generator=generator) for _ in range(count)]


def test_nvidia_quantizers_sit_on_the_se_multiply_and_the_residual_input() -> None:
    """recipe.qat.quantizers=nvidia: NVIDIA's efficientnet-quant blocks quantize both SE multiply operands and the
    SE's pooling input (IC/models/common.py:236-253, efficientnet.py:416-420) and each identity shortcut before
    the addition (efficientnet.py:432-436,449-452); modelopt alone quantizes conv/linear/pool inputs only."""
    from timm.models._efficientnet_blocks import SqueezeExcite

    from imgcls.quantization.placement import extra_quantizer_names

    batches = _batches()
    plain = qat.quantize(_efficientnet(), batches)
    net = qat.quantize(_efficientnet(), batches, quantizers="nvidia")
    ses = [name for name, m in _efficientnet().named_modules() if isinstance(m, SqueezeExcite)]
    skips = [name for name, m in _efficientnet().named_modules() if getattr(m, "has_skip", False)]
    assert len(ses) == 16 and len(skips) == 9  # B0: an SE in every block, 9 blocks with an identity shortcut
    expected = {f"{se}.{q}" for se in ses for q in ("pool_quantizer", "mul_a_quantizer", "mul_b_quantizer")}
    expected |= {f"{block}.residual_quantizer" for block in skips}
    assert extra_quantizer_names(net) == expected and not extra_quantizer_names(plain)
    state = net.state_dict()
    assert all(state[f"{name}._amax"].numel() == 1 and state[f"{name}._amax"] > 0 for name in expected)
    assert qat.count_quantizers(net) == qat.count_quantizers(plain) + len(expected)
    # The quantizers off, the blocks compute timm's forward exactly.
    images = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(qat.without_quantizers(net)(images), qat.without_quantizers(plain)(images))


def test_a_checkpoints_nvidia_quantizers_are_rebuilt_with_their_ranges() -> None:
    """quantizer_state / restore (what a checkpoint, evaluate.py and the exports use): modelopt's restore refuses
    quantizers it did not insert, so placement's are left out of its state and added again after it."""
    from imgcls.quantization.placement import extra_quantizer_names

    net = qat.quantize(_efficientnet(), _batches(), calibrator="percentile", quantizers="nvidia")
    state = qat.quantizer_state(net)
    assert state[qat.PLACEMENT_KEY] == "nvidia"
    fresh = qat.restore(_efficientnet(seed=1), state)
    fresh.load_state_dict(net.state_dict())
    images = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        assert torch.equal(fresh.eval()(images), net(images))
    plain = qat.quantize(_efficientnet(), _batches())
    legacy = qat.quantizer_state(plain)
    del legacy[qat.PLACEMENT_KEY]  # a checkpoint written before the key: modelopt's quantizers only
    restored = qat.restore(_efficientnet(), legacy)
    assert qat.count_quantizers(restored) == qat.count_quantizers(plain) and not extra_quantizer_names(restored)


def test_percentile_calibrator_clips_activations_at_the_histograms_percentile() -> None:
    """recipe.qat.calibrator=percentile, NVIDIA's (IC/quantization.py:22-28 histogram, :124-130 percentile
    99.99): an activation range at the 99.99th percentile of |x|, not its max; weights by their max per
    output channel either way."""
    import numpy as np

    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(8, 3, 32, 32, generator=generator) for _ in range(4)]
    batches[2][0, 0, 0, 0] = 60.0  # one outlier among 98,304 values

    def conv() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))

    by_max = qat.quantize(conv(), batches)[0]
    by_percentile = qat.quantize(conv(), batches, calibrator="percentile", percentile=99.99)[0]
    assert by_max.input_quantizer.amax.item() == pytest.approx(60.0)
    values = torch.cat([b.abs().flatten() for b in batches]).numpy()
    amax = by_percentile.input_quantizer.amax.item()  # the histogram's bin edge at 99.99 % of the values
    assert (values > amax).mean() <= 2e-4 and amax >= float(np.percentile(values, 99.9)) and amax < 5.0
    assert torch.equal(by_max.weight_quantizer.amax, by_percentile.weight_quantizer.amax)
    with pytest.raises(ConfigError, match=r"^recipe.qat.calibrator=entropy must be one of max, percentile$"):
        check_config(compose_config(["recipe=qat", "recipe.qat.calibrator=entropy"]))  # up front; quantize trusts it


def test_nvidia_quantizers_on_a_network_without_efficientnet_blocks_is_one_line() -> None:
    from imgcls.models import build_network

    net = build_network(compose_config(["model=resnet18"]).model, num_classes=10)
    with pytest.raises(ConfigError, match=r"^recipe.qat.quantizers=nvidia places .* use recipe.qat.quantizers="):
        qat.quantize(net, _batches(1, 32), quantizers="nvidia")


def test_nvidias_pytorch_qat_recipes_calibrate_as_quant_main() -> None:
    """quant_main.py:111 calibrate(model, train_loader, calib_iter=10): 11 batches (the loop breaks after batch
    i = 10, IC/quantization.py:87-102) of the training batch, train augmentation, histogram at 99.99; NVIDIA's
    quantized EfficientNet blocks. TF1's recipe (recipe=qat) keeps max calibration on val-preprocessed images."""
    b0 = compose_config(["recipe=qat_efficientnet_b0"]).recipe.qat
    b4 = compose_config(["recipe=qat_efficientnet_b4"]).recipe.qat
    tf1 = compose_config(["recipe=qat"]).recipe.qat
    assert (b0.calibration_images, b0.calibration_batch_size) == (11 * 128, 128)
    assert (b4.calibration_images, b4.calibration_batch_size) == (11 * 32, 32)
    for settings in (b0, b4):
        assert (settings.calibrator, settings.percentile, settings.calibration_preprocessing, settings.quantizers) == (
            "percentile", 99.99, "train", "nvidia",
        )  # fmt: skip
    assert (tf1.calibrator, tf1.calibration_preprocessing, tf1.quantizers) == ("max", "val", "conv_linear")


def test_the_module_quantizes_with_the_recipes_calibrator_and_quantizers() -> None:
    """ClassificationModule.quantize_network (what train.py's configure_model runs) reads recipe.qat."""
    from timm.models._efficientnet_blocks import SqueezeExcite

    from imgcls.training.module import ClassificationModule

    cfg = OmegaConf.to_container(compose_config(["model=efficientnet_b0", "recipe=qat_efficientnet_b0"]), resolve=True)
    module = ClassificationModule(cfg["model"], cfg["recipe"], plan={}, classes=[str(i) for i in range(10)])
    module.quantize_network(_batches())
    se = next(m for m in module.net.modules() if isinstance(m, SqueezeExcite))
    assert type(se).__name__ == "QuantSqueezeExcite"
    assert type(se.mul_a_quantizer._calibrator).__name__ == "HistogramCalibrator"
    assert type(module.net.conv_stem.weight_quantizer._calibrator).__name__ == "MaxCalibrator"


def test_train_augmented_calibration_images_are_seeded(calibration_folder: Path) -> None:
    """recipe.qat.calibration_preprocessing=train: the training augmentation, drawn per image from the seed, so
    every rank and every run calibrates on the same images; not the val preprocessing's."""
    from imgcls.inference.trained import preprocessing_of

    data = compose_config(tiny_overrides(calibration_folder, "data.train_crop_scale=[0.1,0.3]")).data

    def batches(seed: int, augment: bool) -> torch.Tensor:
        return torch.cat(list(calibration_batches(data, preprocessing_of(data), 9, 4, seed, augment=augment)))

    train = batches(0, True)
    assert train.shape == batches(0, False).shape and not torch.equal(train, batches(0, False))
    assert torch.equal(train, batches(0, True)) and not torch.equal(train, batches(1, True))


def test_nvidia_quantizers_export_as_qdq_before_the_se_multiply_and_the_residual_add(tmp_path: Path) -> None:
    """The extra quantizers are modelopt TensorQuantizers: ONNX QuantizeLinear/DequantizeLinear pairs, so every SE
    Mul and every residual Add reads dequantized INT8 tensors (TensorRT's INT8 elementwise kernels), and ONNX
    Runtime computes what the fake-quantized network does."""
    import warnings

    import onnx
    import onnxruntime as ort

    net = qat.quantize(_efficientnet(), _batches(), calibrator="percentile", quantizers="nvidia")
    images = torch.randn(2, 3, 48, 48)
    path = tmp_path / "nvidia.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (images,), str(path), opset_version=18, dynamo=False)  # as export_onnx
    graph = onnx.load(str(path)).graph
    producer = {out: node.op_type for node in graph.node for out in node.output}

    def dequantized(names: Any) -> bool:
        return all(producer.get(name) == "DequantizeLinear" for name in names)

    muls = [n for n in graph.node if n.op_type == "Mul" and dequantized(n.input)]
    adds = [n for n in graph.node if n.op_type == "Add" and dequantized(n.input[1:])]  # input 0: the branch's BN
    assert len(muls) == 16 and len(adds) == 9  # every SE multiply, every residual input
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = net(images).numpy()
    got = session.run(None, {session.get_inputs()[0].name: images.numpy()})[0]
    assert np.abs(got - expected).max() <= 0.05 * np.abs(expected).max() + 1e-6
