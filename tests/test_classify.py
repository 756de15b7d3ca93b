"""imgcls.classify: top-5 per image with the val preprocessing, ImageNet names, batches, bad files, ONNX."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image

from imgcls.classify import classify, load_predictor
from imgcls.classify import run as classify_run
from imgcls.data.imagenet_classes import display_names, imagenet_names
from imgcls.data.transforms import val_transform
from imgcls.errors import ConfigError
from imgcls.export import export_onnx, export_weights
from imgcls.inference.trained import TrainedModel, load_trained
from imgcls.models.factory import build_network
from tests.conftest import TEST_DATA, assert_one_line_error, compose_config, run_clis, sample_photos, tiny_run

# The file names of the 500 ImageNet sample photos (one per class, `<wnid>_<class name>.JPEG`) the project's
# benchmarks read: the names only, no images.
SAMPLE_NAMES = TEST_DATA / "imagenet-sample-photo-names.txt"


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    return tiny_run(tmp_path_factory, image_folder)


@pytest.fixture(scope="module")
def mixed_folder(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five generated JPEGs, a text file named .jpg and a truncated JPEG, in nested folders."""
    root = tmp_path_factory.mktemp("mixed")
    sources = sorted((image_folder / "val").rglob("*.jpg"))[::4][:5]
    for i, source in enumerate(sources):
        (root / f"sub{i % 2}").mkdir(exist_ok=True)
        shutil.copy(source, root / f"sub{i % 2}" / f"img{i}.jpg")
    (root / "sub0" / "notes.jpg").write_text("this is not an image")
    (root / "sub1" / "cut.jpg").write_bytes(sources[0].read_bytes()[:60])
    return root


@pytest.fixture(scope="session")
def photos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return sample_photos(tmp_path_factory.mktemp("classify-photos"), 4)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower().replace("'", "")).strip("_")


def test_imagenet_names_match_the_sample_photos_file_names() -> None:
    names = imagenet_names()
    assert len(names) == 1000 and list(names) == sorted(names) and len(set(names.values())) == 1000
    samples = [re.fullmatch(r"(n\d{8})_(.+)\.JPEG", n) for n in SAMPLE_NAMES.read_text().split()]
    pairs = {m.group(1): m.group(2) for m in samples if m}
    assert len(pairs) == 500
    mismatched = {wnid for wnid, name in pairs.items() if _norm(names[wnid]) != _norm(name)}
    # torchvision names the bird n02012849 "crane bird" (the machine n03126707 is "crane"); the archive
    # says "crane". Every other sample's file name is its class name.
    assert mismatched == {"n02012849"}
    assert names["n02012849"] == "crane bird" and names["n03126707"] == "crane"
    assert display_names(["n01440764", "class_0"]) == ["tench", "class_0"]


@pytest.mark.slow
def test_a_folder_is_classified_in_batches_and_bad_files_are_reported(trained: Path, mixed_folder: Path) -> None:
    predictor = load_predictor(str(trained / "checkpoints" / "last.ckpt"))
    paths = sorted(p for p in mixed_folder.rglob("*.jpg"))
    results = classify(predictor, paths, batch_size=2)
    assert [r["path"] for r in results] == [str(p) for p in paths]
    errors = {Path(r["path"]).name: r["error"] for r in results if "error" in r}
    assert set(errors) == {"notes.jpg", "cut.jpg"} and all("cannot decode image" in e for e in errors.values())
    good = [r for r in results if "top" in r]
    assert len(good) == 5
    for result in good:
        probs = [entry["prob"] for entry in result["top"]]
        assert probs == sorted(probs, reverse=True) and sum(probs) == pytest.approx(1.0, abs=1e-5)
        assert {entry["class"] for entry in result["top"]} == {"class_0", "class_1", "class_2"}
    # Batching does not change a result: one image at a time gives the same probabilities.
    single = classify(predictor, [Path(good[3]["path"])], batch_size=1)[0]
    assert [e["prob"] for e in single["top"]] == pytest.approx([e["prob"] for e in good[3]["top"]], abs=1e-6)


@pytest.mark.slow
def test_imagenet_wnids_print_human_readable_names(photos: list[Path], tmp_path: Path, capsys) -> None:
    model_cfg = OmegaConf.to_container(compose_config(["model=resnet18"]).model, resolve=True)
    net = build_network(OmegaConf.create(model_cfg), 1000).eval()
    preprocessing = {"image_size": 64, "val_crop_pct": 0.875, "interpolation": "bilinear"}
    preprocessing |= {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    model = TrainedModel(net, "resnet18", model_cfg, list(imagenet_names()), preprocessing)
    export_weights(model, tmp_path / "imagenet.pt")
    cfg = compose_config([f"ckpt={tmp_path / 'imagenet.pt'}", f"images=[{photos[0]}]"], config_name="classify")
    classify_run(cfg)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == str(photos[0]) and len(lines) == 6
    for line in lines[1:]:
        match = re.fullmatch(r"\s+\d+\.\d\d%  (.+) \((n\d{8})\)", line)
        assert match and imagenet_names()[match.group(2)] == match.group(1), line


@pytest.mark.slow
def test_onnx_backend_agrees_with_pytorch(trained: Path, photos: list[Path], tmp_path: Path) -> None:
    model = load_trained(trained / "checkpoints" / "last.ckpt")
    export_onnx(model, tmp_path / "tiny.onnx")
    torch_results = classify(load_predictor(str(trained / "checkpoints" / "last.ckpt")), photos)
    onnx_results = classify(load_predictor(str(tmp_path / "tiny.onnx"), backend="onnx"), photos)
    for a, b in zip(torch_results, onnx_results):
        assert [e["class"] for e in a["top"]] == [e["class"] for e in b["top"]]
        assert [e["prob"] for e in a["top"]] == pytest.approx([e["prob"] for e in b["top"]], abs=1e-5)


@pytest.fixture(scope="module")
def cli(trained: Path, mixed_folder: Path) -> dict[str, subprocess.CompletedProcess]:
    ckpt = trained / "checkpoints" / "last.ckpt"
    return run_clis(
        {
            "partial": ["-m", "imgcls.classify", f"ckpt={ckpt}", f"images=[{mixed_folder}]", "batch_size=3", "--json"],
            "single_bad": ["-m", "imgcls.classify", f"ckpt={ckpt}", f"images={mixed_folder / 'sub0' / 'notes.jpg'}"],
            # CKPT IMAGE... as NVIDIA's classify.py and timm's inference.py take them (was a LexerNoViableAltException)
            "positional": ["-m", "imgcls.classify", str(ckpt), *map(str, _two_images(mixed_folder)), "--json"],
        }
    )


def _two_images(folder: Path) -> list[Path]:
    return [folder / "sub1" / "img1.jpg", folder / "sub0" / "img0.jpg"]


@pytest.mark.slow
def test_cli_takes_the_checkpoint_and_images_without_keys(cli: dict, mixed_folder: Path) -> None:
    result = cli["positional"]
    assert result.returncode == 0, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert [r["path"] for r in document] == list(map(str, _two_images(mixed_folder)))
    assert all(r["top"] for r in document)


def test_positional_paths_go_to_ckpt_then_images() -> None:
    from imgcls.cli import with_positional_paths

    cfg = compose_config([], config_name="classify")
    with_positional_paths(cfg, ["m.ckpt", "a.jpg", "b.jpg"])
    assert (cfg.ckpt, list(cfg.images)) == ("m.ckpt", ["a.jpg", "b.jpg"])
    cfg = compose_config(["ckpt=m.onnx", "images=[a.jpg]"], config_name="classify")
    with_positional_paths(cfg, ["b.jpg", "dir"])  # ckpt= named it: every path is an image, after images=
    assert (cfg.ckpt, list(cfg.images)) == ("m.onnx", ["a.jpg", "b.jpg", "dir"])


@pytest.mark.slow
def test_cli_reports_bad_files_by_name_and_classifies_the_others(cli: dict, mixed_folder: Path) -> None:
    result = cli["partial"]
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert len(document) == 7 and sum("top" in r for r in document) == 5
    errors = [line for line in result.stderr.splitlines() if line.startswith("imgcls: error:")]
    assert sorted(Path(line.split(": ")[2]).name for line in errors) == ["cut.jpg", "notes.jpg"]


@pytest.mark.slow
def test_cli_one_bad_image_is_a_one_line_error(cli: dict) -> None:
    assert_one_line_error(cli["single_bad"], "notes.jpg: cannot decode image")


@pytest.mark.slow
def test_no_images_is_an_error(trained: Path) -> None:
    with pytest.raises(ConfigError, match=r"images=\[FILE_OR_DIR,...\] is required"):
        classify_run(compose_config([f"ckpt={trained / 'checkpoints' / 'last.ckpt'}"], config_name="classify"))


@pytest.mark.slow
def test_probabilities_are_softmax_of_the_logits(trained: Path, photos: list[Path]) -> None:
    model = load_trained(trained / "checkpoints" / "last.ckpt")
    image = val_transform(OmegaConf.create(model.preprocessing))(Image.open(photos[1]).convert("RGB"))
    with torch.no_grad():
        expected = torch.softmax(model.net(image[None]), dim=1)[0]
    result = classify(load_predictor(str(trained / "checkpoints" / "last.ckpt")), [photos[1]])[0]
    for entry in result["top"]:
        assert entry["prob"] == pytest.approx(float(expected[model.classes.index(entry["class"])]), abs=1e-6)
