"""Bad image files: every kind generated, decodable ones become RGB and train, undecodable ones follow
data.on_bad_image (skip: one warning per file and a count in report.json; error: the file's path)."""

from __future__ import annotations

import io
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgcls.cli import guarded
from imgcls.data.backends import make_backend
from imgcls.data.images import BadImage, load_rgb, scan_file
from imgcls.train import run
from tests.conftest import compose_config, make_image_folder, read_report, tiny_overrides

DECODABLE = ["png_named.jpg", "gif_named.jpg", "cmyk.jpg", "gray.jpg", "gray16.png", "rgba.png", "huge.jpg"]
UNDECODABLE = ["zero_byte.jpg", "truncated.jpg", "text.jpg"]


def make_bad_images(folder: Path) -> None:
    """One file of each kind the issue lists, 48x40 except the 12000x9000 one."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    rgb = Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))
    (folder / "zero_byte.jpg").write_bytes(b"")
    buffer = io.BytesIO()
    rgb.save(buffer, "JPEG")
    (folder / "truncated.jpg").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    (folder / "text.jpg").write_text("this is not an image\n")
    rgb.save(folder / "png_named.jpg", "PNG")
    rgb.convert("P").save(folder / "gif_named.jpg", "GIF")
    rgb.convert("CMYK").save(folder / "cmyk.jpg", "JPEG")
    rgb.convert("L").save(folder / "gray.jpg", "JPEG")
    Image.fromarray(rng.integers(0, 65535, (40, 48)).astype(np.uint16)).save(folder / "gray16.png")
    rgb.convert("RGBA").save(folder / "rgba.png")
    Image.new("RGB", (12000, 9000), (10, 120, 200)).save(folder / "huge.jpg", "JPEG", quality=50)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("kinds")
    make_bad_images(folder)
    return folder


@pytest.fixture(scope="module")
def dirty(tmp_path_factory: pytest.TempPathFactory, kinds: Path) -> Path:
    """26 good train images plus the 10 kinds in train/class_0: 36 files, 33 decodable."""
    root = make_image_folder(tmp_path_factory.mktemp("dirty"), classes=3, train_per_class=8, val_per_class=2)
    for f in kinds.iterdir():
        shutil.copy(f, root / "train" / "class_0" / f"x_{f.name}")
    for i in range(2):
        shutil.copy(root / "train" / "class_1" / "000.jpg", root / "train" / "class_1" / f"extra_{i}.jpg")
    return root


@pytest.mark.parametrize("name", DECODABLE)
def test_decodable_files_become_8bit_rgb(kinds: Path, name: str) -> None:
    image = load_rgb(str(kinds / name))
    assert image.mode == "RGB"
    assert image.size == ((12000, 9000) if name == "huge.jpg" else (48, 40))
    if name == "gray16.png":  # scaled to 8 bits, not clipped to white as PIL's convert("RGB") does
        assert 100 < np.asarray(image).mean() < 160


@pytest.mark.parametrize("name", UNDECODABLE)
def test_undecodable_files_are_bad(kinds: Path, name: str) -> None:
    with pytest.raises(BadImage):
        load_rgb(str(kinds / name))


def test_dali_prescan_flags_what_dali_cannot_decode(kinds: Path) -> None:
    flagged = {f.name for f in kinds.iterdir() if scan_file(str(f))}
    assert flagged == {*UNDECODABLE, "gif_named.jpg"}  # DALI has no GIF decoder


def train_epoch_samples(cfg, caplog: pytest.LogCaptureFixture) -> tuple[int, list[str]]:
    backend = make_backend(cfg)
    loader = backend.loader("train", batch_size=6, rank=0, world_size=1, seed=0)  # 36 files: no tail
    with caplog.at_level(logging.WARNING):
        count = sum(len(labels) for _, labels in loader)
        count2 = sum(len(labels) for _, labels in loader)  # a second epoch warns no more
    assert count == count2
    return count, [r.getMessage() for r in caplog.records if "bad image" in r.getMessage()]


def test_torchvision_skip_keeps_every_other_sample(dirty: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = compose_config(tiny_overrides(dirty, "model.image_size=32")).data
    count, warnings = train_epoch_samples(cfg, caplog)
    assert count == 26 + len(DECODABLE)
    assert len(warnings) == len(UNDECODABLE)  # one per file, over two epochs
    for name in UNDECODABLE:
        assert sum(f"x_{name}" in w for w in warnings) == 1


def test_dali_cpu_prescan_skips_bad_files(dirty: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("nvidia.dali")
    cfg = compose_config(tiny_overrides(dirty, "data.backend=dali_cpu", "data.num_workers=1")).data
    count, warnings = train_epoch_samples(cfg, caplog)
    # Pre-scanned files leave the file list before batching: 32 files, 5 full batches of 6; the GIF goes too.
    assert count == (26 + len(DECODABLE) - 1) // 6 * 6
    assert len(warnings) == len(UNDECODABLE) + 1


def test_training_skips_bad_files_and_reports_them(dirty: Path, tmp_path: Path) -> None:
    run(compose_config(tiny_overrides(dirty, "recipe.epochs=1", "data.batch_size=4", "recipe.global_batch_size=4"),
                       run_dir=tmp_path))
    report = read_report(tmp_path)
    assert report["bad_images"]["count"] == len(UNDECODABLE)
    assert sorted(Path(p).name for p in report["bad_images"]["files"]) == sorted(f"x_{n}" for n in UNDECODABLE)
    assert report["epochs"][0]["step"] == 36 // 4  # no batch lost: a batch with a bad file trains on the rest
    assert np.isfinite(report["epochs"][0]["train.loss"])


@pytest.mark.parametrize("backend", ["torchvision", "dali_cpu"])
def test_error_policy_stops_with_the_path(
    dirty: Path, tmp_path: Path, capsys: pytest.CaptureFixture, backend: str
) -> None:
    if backend == "dali_cpu":
        pytest.importorskip("nvidia.dali")
    overrides = tiny_overrides(dirty, "recipe.epochs=1", "data.on_bad_image=error", f"data.backend={backend}")
    with pytest.raises(SystemExit) as exit_info:
        guarded(run, compose_config(overrides, run_dir=tmp_path / "run"))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("imgcls: error:")]
    assert exit_info.value.code == 2 and len(lines) == 1 and "Traceback" not in err
    assert "x_" in lines[0] and str(dirty) in lines[0] and "data.on_bad_image=error" in lines[0]


def test_unknown_policy_is_a_config_error(dirty: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        guarded(run, compose_config(tiny_overrides(dirty, "data.on_bad_image=ignore"), run_dir=tmp_path))
    assert exit_info.value.code == 2
    assert "data.on_bad_image=ignore is not allowed; use skip or error" in capsys.readouterr().err
