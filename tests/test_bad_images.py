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
from imgcls.data.bad_images import MAX_PIXELS, BadImage
from imgcls.data.image_scan import scan_file
from imgcls.data.images import load_rgb
from imgcls.data.protocol import LoaderSpec
from imgcls.run.train import run
from tests.conftest import compose_config, make_image_folder, read_report, tiny_overrides

DECODABLE = ["png_named.jpg", "gif_named.jpg", "cmyk.jpg", "gray.jpg", "gray16.png", "rgba.png"]
# huge.jpg: 12000x9000 (108 MP), over PIL's own pixel limit (89.5 MP), data.max_image_pixels's default: a small
# file can declare gigabytes of pixels.
UNDECODABLE = ["zero_byte.jpg", "truncated.jpg", "text.jpg", "huge.jpg"]


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
    """26 good train images plus the 10 kinds in train/class_0: 36 files, 32 decodable."""
    root = make_image_folder(tmp_path_factory.mktemp("dirty"), classes=3, train_per_class=8, val_per_class=2)
    for f in kinds.iterdir():
        shutil.copy(f, root / "train" / "class_0" / f"x_{f.name}")
    for i in range(2):
        shutil.copy(root / "train" / "class_1" / "000.jpg", root / "train" / "class_1" / f"extra_{i}.jpg")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("name", DECODABLE)
def test_decodable_files_become_8bit_rgb(kinds: Path, name: str) -> None:
    image = load_rgb(str(kinds / name))
    assert image.mode == "RGB"
    assert image.size == (48, 40)
    if name == "gray16.png":  # scaled to 8 bits, not clipped to white as PIL's convert("RGB") does
        assert 100 < np.asarray(image).mean() < 160


@pytest.mark.parametrize("name", UNDECODABLE)
def test_undecodable_files_are_bad(kinds: Path, name: str) -> None:
    with pytest.raises(BadImage):
        load_rgb(str(kinds / name))


def test_dali_prescan_flags_what_dali_cannot_decode(kinds: Path) -> None:
    flagged = {f.name for f in kinds.iterdir() if scan_file(str(f))}
    assert flagged == {*UNDECODABLE, "gif_named.jpg"}  # DALI has no GIF decoder


def test_fast_jpeg_check_agrees_with_pil(kinds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scan_bytes passes a plain JPEG without PIL; its verdicts must be those of the PIL path alone."""
    from imgcls.data import image_scan

    rgb = Image.fromarray(np.random.default_rng(2).integers(0, 255, (40, 48, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    rgb.save(buffer, "JPEG", progressive=True, exif=b"Exif\x00\x00" + bytes(3000))
    data = bytearray(buffer.getvalue())
    sof = data.find(b"\xff\xc2")
    huge = bytearray(data)
    # A 10000x10000 header: over MAX_PIXELS, under twice it (where PIL's open refuses it itself, in its own words).
    huge[sof + 5 : sof + 9] = (10000).to_bytes(2, "big") * 2
    (tmp_path / "progressive_exif.jpg").write_bytes(bytes(data))
    (tmp_path / "huge_header.jpg").write_bytes(bytes(huge))
    files = [*kinds.iterdir(), *tmp_path.iterdir()]
    fast = {f.name for f in files if image_scan._plain_jpeg(memoryview(f.read_bytes()))}
    assert fast == {"cmyk.jpg", "gray.jpg", "progressive_exif.jpg"}  # huge.jpg: over MAX_PIXELS
    verdicts = {f.name: scan_file(str(f)) for f in files}
    monkeypatch.setattr(image_scan, "_plain_jpeg", lambda data: False)
    assert verdicts == {f.name: scan_file(str(f)) for f in files}
    assert verdicts["huge_header.jpg"] == f"larger than data.max_image_pixels={MAX_PIXELS} pixels"


def test_a_raised_pixel_limit_decodes_large_photos_on_both_backends(kinds: Path, tmp_path: Path) -> None:
    """data.max_image_pixels=120000000: the 108 MP photo is decoded (torchvision) and passes DALI's pre-scan; the
    DataModule sets the limit before any loader (or forked worker) exists."""
    from imgcls.data import bad_images
    from imgcls.data.datamodule import ClassificationDataModule

    root = make_image_folder(tmp_path / "data", classes=2, train_per_class=2, val_per_class=1)
    cfg = compose_config(tiny_overrides(root, "data.max_image_pixels=120000000"), run_dir=tmp_path / "run")
    try:
        ClassificationDataModule(cfg.data, batch_size=2)
        assert bad_images.max_pixels() == 120_000_000
        assert load_rgb(str(kinds / "huge.jpg")).size == (12000, 9000)
        assert scan_file(str(kinds / "huge.jpg")) is None
    finally:
        bad_images.set_max_pixels(MAX_PIXELS)
    with pytest.raises(BadImage, match="exceeds limit of 89478485 pixels"):  # PIL says so first, as it opens
        load_rgb(str(kinds / "huge.jpg"))


def train_epoch_samples(cfg, caplog: pytest.LogCaptureFixture) -> tuple[int, list[str]]:
    backend = make_backend(cfg)
    loader = backend.loader(LoaderSpec("train", batch_size=6))  # 36 files: no tail
    with caplog.at_level(logging.WARNING):
        count = sum(len(labels) for _, labels in loader)
        count2 = sum(len(labels) for _, labels in loader)  # a second epoch warns no more
    assert count == count2
    return count, [r.getMessage() for r in caplog.records if "bad image" in r.getMessage()]


@pytest.mark.slow
def test_torchvision_skip_keeps_every_other_sample(dirty: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = compose_config(tiny_overrides(dirty, "model.image_size=32")).data
    count, warnings = train_epoch_samples(cfg, caplog)
    assert count == 26 + len(DECODABLE)
    assert len(warnings) == len(UNDECODABLE)  # one per file, over two epochs
    for name in UNDECODABLE:
        assert sum(f"x_{name}" in w for w in warnings) == 1


@pytest.mark.slow
def test_dali_cpu_skips_bad_files_in_their_batch(dirty: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("nvidia.dali")
    cfg = compose_config(tiny_overrides(dirty, "data.backend=dali_cpu", "data.num_workers=1")).data
    count, warnings = train_epoch_samples(cfg, caplog)
    # As torchvision: checked as DALI reads them, bad files leave their batch (6 batches of 6); the GIF goes too.
    assert count == 36 - len(UNDECODABLE) - 1
    assert len(warnings) == len(UNDECODABLE) + 1  # one per file, over two epochs
    for name in [*UNDECODABLE, "gif_named.jpg"]:
        assert sum(f"x_{name}" in w for w in warnings) == 1


@pytest.mark.slow
def test_training_skips_bad_files_and_reports_them(dirty: Path, tmp_path: Path) -> None:
    run(
        compose_config(
            tiny_overrides(dirty, "recipe.epochs=1", "data.batch_size=4", "recipe.global_batch_size=4"),
            run_dir=tmp_path,
        )
    )
    report = read_report(tmp_path)
    assert report["bad_images"]["count"] == len(UNDECODABLE)
    assert sorted(Path(p).name for p in report["bad_images"]["files"]) == sorted(f"x_{n}" for n in UNDECODABLE)
    assert report["epochs"][0]["step"] == 36 // 4  # no batch lost: a batch with a bad file trains on the rest
    assert np.isfinite(report["epochs"][0]["train.loss"])


@pytest.mark.slow
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
    assert "data.on_bad_image=ignore must be one of skip, error" in capsys.readouterr().err


# --- mixup/cutmix with a skipped file (docs/reliability.md, "Bad images") ---------------------------------
def one_bad_file(root: Path, kind: str) -> Path:
    """15 good train images and one bad file: 4 full batches of 4, one of which the bad file leaves at 3."""
    make_image_folder(root, classes=3, train_per_class=5, val_per_class=2)
    bad = root / "train" / "class_0" / "bad.jpg"
    if kind == "empty":
        bad.write_bytes(b"")
    else:
        buffer = io.BytesIO()
        Image.fromarray(np.full((40, 48, 3), 90, np.uint8)).save(buffer, "JPEG")
        bad.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    return root


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torchvision", "dali_cpu"])
@pytest.mark.parametrize("kind", ["empty", "truncated"])
def test_mixup_recipe_trains_past_a_bad_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str,
                                             backend: str) -> None:  # fmt: skip
    """recipe=250e (mixup 0.2) on a folder with one bad .jpg died with "Batch size should be even"."""
    from imgcls.training.module import ClassificationModule

    if backend == "dali_cpu":
        pytest.importorskip("nvidia.dali")
    sizes: list[int] = []  # the batch sizes that reached mixup, counted by wrapping the real method
    mix = ClassificationModule._mix

    def counted(self: ClassificationModule, images, labels):  # noqa: ANN001, ANN202
        sizes.append(len(labels))
        return mix(self, images, labels)

    monkeypatch.setattr(ClassificationModule, "_mix", counted)
    extra = ["recipe=250e", "recipe.epochs=1", "data.batch_size=4", "recipe.global_batch_size=4",
             f"data.backend={backend}", *(["data.num_workers=1"] if backend == "dali_cpu" else [])]  # fmt: skip
    run(compose_config(tiny_overrides(one_bad_file(tmp_path / "data", kind), *extra), run_dir=tmp_path / "run"))
    report = read_report(tmp_path / "run")
    assert report["bad_images"]["count"] == 1
    assert report["epochs"][0]["step"] == len(sizes)
    if backend == "torchvision" or 3 in sizes:  # the file leaves its batch as it is read
        assert sorted(sizes) == [3, 4, 4, 4]
        assert report["bad_images"]["mixup_dropped_samples"] == 1
    else:  # a pre-scan took the file out of the list before batching: every batch full, nothing dropped
        assert sizes == [4, 4, 4]
        assert "mixup_dropped_samples" not in report["bad_images"]


@pytest.mark.slow
def test_mixup_evens_an_odd_batch_and_leaves_one_sample_unmixed() -> None:
    import torch
    from omegaconf import OmegaConf

    from imgcls.run.plan import resolve_plan
    from imgcls.training.module import ClassificationModule

    cfg = compose_config(["model=resnet18", "recipe=250e", "data=synthetic", "data.num_classes=3"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    module = ClassificationModule(resolved["model"], resolved["recipe"], resolve_plan(cfg).as_dict(), ["a", "b", "c"])
    images, labels = torch.randn(5, 3, 32, 32), torch.tensor([0, 1, 2, 0, 1])
    mixed, kept, targets = module._mix(images, labels)
    assert mixed.shape[0] == targets.shape[0] == len(kept) == 4 and torch.equal(kept, labels[:4])
    assert module.mixup_dropped_samples == 1 and module.mixup_unmixed_batches == 0
    one, kept, target = module._mix(images[:1], labels[:1])  # nothing to pair it with: its smoothed label
    assert torch.equal(one, images[:1]) and torch.equal(kept, labels[:1])
    assert torch.allclose(target, torch.tensor([[0.9 + 0.1 / 3, 0.1 / 3, 0.1 / 3]]))
    assert module.mixup_dropped_samples == 1 and module.mixup_unmixed_batches == 1


@pytest.mark.slow
def test_mixup_drop_count_continues_across_a_resume(tmp_path: Path) -> None:
    """One odd batch per epoch: 2 after a run stopped after epoch 1 and resumed for epoch 2 (checkpoint state)."""
    argv = tiny_overrides(one_bad_file(tmp_path / "data", "empty"), "recipe=250e", "data.batch_size=4",
                          "recipe.global_batch_size=4", "recipe.epochs=2")  # fmt: skip
    run(compose_config([*argv, "trainer.max_epochs=1"], run_dir=tmp_path / "run"))
    assert read_report(tmp_path / "run")["bad_images"]["mixup_dropped_samples"] == 1
    run(compose_config([*argv, "ckpt_path=last"], run_dir=tmp_path / "run"))
    report = read_report(tmp_path / "run")
    assert [r["epoch"] for r in report["epochs"]] == [0, 1]
    assert report["bad_images"]["mixup_dropped_samples"] == 2
