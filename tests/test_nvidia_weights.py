"""NVIDIA's published PyTorch weights (NGC) load into imgcls's timm networks and give NVIDIA's logits.

How the key maps (src/imgcls/models/nvidia_weights.py) were checked:
1. tests/nvidia_reference rebuilds NVIDIA's networks with NVIDIA's module names. Against NVIDIA's own code
   (DeepLearningExamples 729963dd, IC/models/{resnet,efficientnet}.py, run with NVIDIA_DLE_DIR set:
   test_reference_matches_nvidias_own_code) every state_dict key and shape is identical, in order (320 keys
   resnet50, 626 resnext101-32x4d, 758 se-resnext101-32x4d, 360 efficientnet-b0 / widese-b0, 706
   efficientnet-b4 / widese-b4; Linear and --trt SE), and the logits with the same weights differ by at
   most 2.1e-7 (se-resnext101-32x4d; 0.0 for the others).
2. Here: the reference network with random weights and random BN statistics is saved in each layout NVIDIA
   published (20.06 / 20.12 NGC files `layer1.0.conv1` / `layer1.block0` behind `module.`; the current
   `layers.0.0` / `layers.0.block0`; bare, or in main.py's `state_dict` wrapper; SE as Linear or as
   --trt 1x1 convs), loaded through model.weights, classify and evaluate, and the logits are compared
   on real JPEGs (conftest's image folder) in eval mode: max |difference| <= 1e-5 (measured: 0.0 for
   resnet50 / resnext101-32x4d, <= 1.5e-7 for se-resnext101-32x4d and the EfficientNets). A wrong map
   cannot pass: every tensor must land in a parameter of the same shape (strict load) and the logits must
   agree. NVIDIA's EfficientNet pads (k-1)/2 on every side, as timm's efficientnet_b* do (not TF 'same'),
   so the match is exact up to float rounding.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from imgcls.data.imagenet_classes import imagenet_names
from imgcls.errors import CheckpointError
from imgcls.models import build_network
from tests import nvidia_reference
from tests.conftest import compose_config

# NVIDIA --arch -> imgcls model overrides (SE-ResNeXt: NVIDIA's SE width 16 is read from the file's shapes).
MODELS = {
    "resnet50": ["model=resnet50"],
    "resnext101-32x4d": ["model=resnext101_32x4d"],
    "se-resnext101-32x4d": ["model=se_resnext101_32x4d"],
    "efficientnet-b0": ["model=efficientnet_b0"],
    "efficientnet-b4": ["model=efficientnet_b4"],
    "efficientnet-widese-b0": ["model=efficientnet_widese_b0"],
    "efficientnet-widese-b4": ["model=efficientnet_widese_b4"],
}
TOLERANCE = 1e-5


def nvidia_file(path: Path, net: torch.nn.Module, layout: str, wrapper: bool) -> Path:
    """Save `net` as NVIDIA did: NGC files (`old`: layer1..., DDP's `module.` prefix) or the current layout,
    optionally in main.py's checkpoint dict (`state_dict` plus epoch, arch, best_prec1)."""
    state = net.state_dict()
    if layout == "old":
        state = {f"module.{k}": v for k, v in nvidia_reference.old_layout(state).items()}
    blob = {"epoch": 90, "arch": "nvidia", "state_dict": state, "best_prec1": 0.0} if wrapper else state
    torch.save(blob, path)
    return path


@pytest.fixture(scope="module")
def images(image_folder: Path) -> torch.Tensor:
    """Six of conftest's real JPEGs through imgcls's val preprocessing at 64 px."""
    from imgcls.data.transforms import val_transform

    data = OmegaConf.create({**_preprocessing("resnet50"), "image_size": 64})
    paths = sorted((image_folder / "val").rglob("*.jpg"))[::3][:6]
    return torch.stack([val_transform(data)(Image.open(p).convert("RGB")) for p in paths])


def _preprocessing(model: str) -> dict:
    from imgcls.classify import model_preprocessing

    return model_preprocessing(model)


def max_logit_difference(net: torch.nn.Module, reference: torch.nn.Module, images: torch.Tensor) -> float:
    with torch.no_grad():
        return (net.eval()(images) - reference(images)).abs().max().item()


# One network per family NVIDIA published weights for (ResNet, (SE-)ResNeXt, EfficientNet); between them both
# layouts of each family, the `module.` prefix, main.py's `state_dict` wrapper, SE as Linear and as --trt 4-D
# convs in both SE families, and wide SE. The bigger siblings (resnext101-32x4d without SE, efficientnet-b4,
# widese-b4) go through the same key maps with more blocks (models/nvidia_weights.py renames by pattern, not per
# network); each would add seconds of CPU building two networks (2 cores, -n 2: CI's budget).
CASES = [
    ("resnet50", "old", False, False),  # nvidia_resnet50_200821.pth.tar as on NGC
    ("se-resnext101-32x4d", "old", False, False),
    ("se-resnext101-32x4d", "current", True, True),
    ("efficientnet-b0", "current", True, True),
    ("efficientnet-widese-b0", "old", True, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("arch,layout,wrapper,trt", CASES)
def test_model_weights_give_nvidias_logits(
    arch: str, layout: str, wrapper: bool, trt: bool, images: torch.Tensor, tmp_path: Path
) -> None:
    reference = nvidia_reference.build(arch, trt=trt)
    path = nvidia_file(tmp_path / "nvidia.pth", reference, layout, wrapper)
    net = build_network(compose_config([*MODELS[arch], f"model.weights={path}"]).model, num_classes=1000)
    assert max_logit_difference(net, reference, images) <= TOLERANCE


@pytest.mark.slow
def test_classify_reads_an_ngc_file_given_its_model(image_folder: Path, tmp_path: Path) -> None:
    """`python -m imgcls.classify ckpt=NGC_FILE model=efficientnet_b0 images=[...]`: NVIDIA's probabilities."""
    from imgcls.classify import run as classify_run
    from imgcls.data.transforms import val_transform

    reference = nvidia_reference.build("efficientnet-b0")
    path = nvidia_file(tmp_path / "nvidia_efficientnet-b0_210412.pth", reference, "old", wrapper=False)
    paths = sorted((image_folder / "val").rglob("*.jpg"))[:3]
    cfg = compose_config(
        [f"ckpt={path}", "model=efficientnet_b0", f"images=[{','.join(map(str, paths))}]"], config_name="classify"
    )
    results = classify_run(cfg)["results"]
    transform = val_transform(OmegaConf.create(_preprocessing("efficientnet_b0")))  # 224 px, as classify
    with torch.no_grad():
        probs = torch.softmax(reference(torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])), 1)
    wnids = list(imagenet_names())
    for result, expected in zip(results, probs):
        top = result["top"]
        assert len(top) == 5
        for entry in top:
            assert entry["prob"] == pytest.approx(expected[wnids.index(entry["class"])].item(), abs=1e-6)
        assert top[0]["class"] == wnids[int(expected.argmax())]


@pytest.mark.slow
def test_evaluate_reads_an_nvidia_main_py_checkpoint(image_folder: Path, tmp_path: Path) -> None:
    """`python evaluate.py ckpt=checkpoint.pth.tar model=efficientnet_b0 data.root=DIR`: a main.py checkpoint
    (`state_dict` wrapper, `module.` keys, --trt SE) of a 3-class network, as NVIDIA's code trains on a
    3-class folder. Its top-1 and loss are those of NVIDIA's network on the same images."""
    from imgcls.data.datamodule import ClassificationDataModule
    from imgcls.run.evaluate import run as evaluate

    reference = nvidia_reference.build("efficientnet-b0", num_classes=3, trt=True)
    state = {f"module.{k}": v for k, v in reference.state_dict().items()}
    path = tmp_path / "checkpoint.pth.tar"
    torch.save({"epoch": 3, "arch": "efficientnet-b0", "state_dict": state, "best_prec1": 0.0}, path)
    overrides = [f"ckpt={path}", "model=efficientnet_b0", f"data.root={image_folder}", "data.num_workers=0"]
    overrides.append("model.image_size=64")  # small images: a fast test
    overrides.append("data.val_crop_padding=32")  # NVIDIA's eval protocol: resize to 96, crop 64
    metrics = evaluate(
        compose_config(["trainer.enable_progress_bar=false", *overrides], config_name="evaluate", run_dir=tmp_path)
    )

    data = compose_config(["data=folder", *overrides[1:]]).data
    loader = ClassificationDataModule(data, batch_size=8)
    loader.setup("validate")
    logits, labels = [], []
    with torch.no_grad():
        for uint8_batch in loader.val_dataloader():
            batch, target = loader.on_after_batch_transfer(uint8_batch, 0)  # as Lightning does on the device
            logits.append(reference(batch))
            labels.append(target)
    logits, labels = torch.cat(logits), torch.cat(labels)
    assert len(labels) == 18
    top1 = 100.0 * (logits.argmax(1) == labels).float().mean().item()
    assert metrics["val.top1"] == pytest.approx(top1, abs=1e-4)
    assert metrics["val.loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item(), abs=1e-5)


@pytest.mark.slow
def test_a_file_of_no_known_layout_names_the_closest_and_its_missing_keys(tmp_path: Path) -> None:
    state = nvidia_reference.build("resnet50").state_dict()
    for key in ("layers.3.2.conv3.weight", "layers.3.2.bn3.weight"):
        del state[key]
    path = tmp_path / "truncated.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointError) as error:
        build_network(compose_config(["model=resnet50", f"model.weights={path}"]).model, num_classes=1000)
    message = str(error.value)
    assert "\n" not in message
    assert "closest key layout: NVIDIA ResNet, current (layers.0.0.conv1" in message
    assert "2 missing" in message and "layer4.2.conv3.weight" in message and "layer4.2.bn3.weight" in message


@pytest.mark.slow
def test_nvidias_se_resnext_loads_with_the_model_name_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The NGC SE-ResNeXt file (20.06 layout, every SE squeezed to 16 channels, not imgcls's default C/16) with
    model=se_resnext101_32x4d alone: the SE width comes from the file's shapes, the log says so, and the network
    computes what NVIDIA's does; the same file through evaluate's plain-state_dict path too."""
    from imgcls.config.compose import model_config
    from imgcls.inference.trained import load_trained

    reference = nvidia_reference.build("se-resnext101-32x4d").eval()
    path = nvidia_file(tmp_path / "se.pth", reference, "old", wrapper=False)
    with caplog.at_level("INFO", logger="imgcls.models.factory"):
        net = build_network(compose_config(["model=se_resnext101_32x4d", f"model.weights={path}"]).model, 1000).eval()
    assert "model.se_width=16" in caplog.text
    assert net.layer2[0].se.fc1.weight.shape[0] == 16 and net.layer4[0].se.fc1.weight.shape[0] == 16
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(net(images), reference(images), atol=TOLERANCE)
    cfg = compose_config(["model=se_resnext101_32x4d"], config_name="evaluate")
    trained = load_trained(path, model_cfg=model_config(cfg))
    assert trained.net.layer3[0].se.fc1.weight.shape[0] == 16


@pytest.mark.slow
def test_classify_and_evaluate_name_nvidias_layout_of_a_file_that_does_not_fit(tmp_path: Path) -> None:
    """A widese-B0 NGC file given model=efficientnet_b0 (the plain-state_dict path of classify and evaluate)."""
    from imgcls.config.compose import model_config
    from imgcls.inference.trained import load_trained

    path = nvidia_file(tmp_path / "w.pth", nvidia_reference.build("efficientnet-widese-b0"), "old", wrapper=False)
    model_cfg = model_config(compose_config(["model=efficientnet_b0"], config_name="classify"))
    with pytest.raises(CheckpointError, match=r"another shape .*closest key layout: NVIDIA EfficientNet, NGC 20\.12"):
        load_trained(path, model_cfg=model_cfg)


@pytest.mark.slow
def test_an_ngc_file_of_another_network_is_refused(tmp_path: Path) -> None:
    """An NGC EfficientNet file given model=resnet50: one line naming what does not fit, nothing loaded."""
    path = nvidia_file(tmp_path / "se.pth", nvidia_reference.build("efficientnet-b0"), "old", wrapper=False)
    with pytest.raises(CheckpointError, match=r"does not fit model resnet50: .*closest key layout: "):
        build_network(compose_config(["model=resnet50", f"model.weights={path}"]).model, num_classes=1000)


@pytest.mark.skipif(not os.environ.get("NVIDIA_DLE_DIR"), reason="NVIDIA_DLE_DIR (a DeepLearningExamples checkout)")
@pytest.mark.parametrize("arch", list(MODELS))
def test_reference_matches_nvidias_own_code(arch: str) -> None:
    """tests/nvidia_reference against NVIDIA's modules (IC/models/*.py, pytorch_quantization not needed):
    same keys and shapes in the same order, same logits with the same weights, Linear and --trt SE."""
    sys.path.insert(0, str(Path(os.environ["NVIDIA_DLE_DIR"]) / "PyTorch" / "Classification" / "ConvNets"))
    import image_classification.models as nvidia

    for trt in (False, True):
        theirs = getattr(nvidia, arch.replace("-", "_"))(pretrained=False, trt=trt).eval()
        ours = nvidia_reference.build(arch, trt=trt)
        assert [(k, v.shape) for k, v in theirs.state_dict().items()] == [
            (k, v.shape) for k, v in ours.state_dict().items()
        ]
        theirs.load_state_dict(ours.state_dict())
        images = torch.randn(2, 3, 64, 64)
        assert max_logit_difference(theirs, ours, images) <= 1e-6
