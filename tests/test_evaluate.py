"""evaluate.py: the numbers equal training's own validation; weights-only files; one-line errors.

The tiny checkpoint (resnet18, 32 px, 3 classes, EMA 0.9) is trained once per session by `tiny_run`,
which the other test modules of this feature import (the run dir is cached on disk for the session).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from imgcls.errors import CheckpointError, ConfigError, DataError
from imgcls.export import export_weights
from imgcls.inference.trained import load_trained
from imgcls.run.evaluate import run as evaluate
from tests.conftest import ROOT, assert_one_line_error, compose_config, read_report, run_clis, tiny_run


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    return tiny_run(tmp_path_factory, image_folder)


def _evaluate(tmp_path: Path, *overrides: str) -> dict[str, float]:
    cfg = compose_config(["trainer.enable_progress_bar=false", *overrides], config_name="evaluate", run_dir=tmp_path)
    return evaluate(cfg)


@pytest.mark.slow
def test_evaluate_equals_the_validation_training_logged(trained: Path, image_folder: Path, tmp_path: Path) -> None:
    last_row = read_report(trained)["epochs"][-1]
    metrics = _evaluate(tmp_path, f"ckpt={trained / 'checkpoints' / 'last.ckpt'}", f"data.root={image_folder}")
    # Same weights, val batches and torchmetrics as training's last validation: the same numbers.
    assert metrics["val.top1"] == last_row["val.top1"]
    assert metrics["val.top5"] == last_row["val.top5"]
    assert metrics["val.loss"] == pytest.approx(last_row["val.loss"], rel=1e-6)
    written = json.loads((tmp_path / "eval.json").read_text())
    for name in ("val.top1", "val.top5", "val.loss", "val.total_ips", "val.compute_ips"):
        assert written[name] == pytest.approx(metrics[name])
    assert written["val.total_ips"] > 0 and written["weights"] == "raw" and written["model"] == "test_resnet"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torchvision", "dali_cpu"])
def test_a_val_split_alone_evaluates(trained: Path, image_folder: Path, tmp_path: Path, backend: str) -> None:
    """The checkpoint names the classes: a val/ folder alone is data enough (no train/ to count them from)."""
    if backend == "dali_cpu":
        pytest.importorskip("nvidia.dali")
    only_val = tmp_path / "val-only"
    shutil.copytree(image_folder / "val", only_val / "val")
    ckpt = f"ckpt={trained / 'checkpoints' / 'last.ckpt'}"
    metrics = _evaluate(tmp_path / "a", ckpt, f"data.root={only_val}", f"data.backend={backend}")
    assert metrics["val.top1"] == read_report(trained)["epochs"][-1]["val.top1"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torchvision", "dali_cpu"])
def test_tfrecords_without_a_manifest_take_the_checkpoints_class_names(
    trained: Path, image_folder: Path, tmp_path: Path, backend: str
) -> None:
    """NVIDIA-style TFRecords (label numbers only, no manifest.json, as build_imagenet_data.py writes them): the
    checkpoint names the classes when the counts agree, and the metrics are those of the same images as a folder."""
    from imgcls.data.shards.convert import convert

    shards = convert(image_folder, tmp_path / "shards", "tfrecord", shard_size=4, progress=False)
    shards.unlink()  # convert returns the manifest it wrote
    shards = shards.parent
    ckpt = f"ckpt={trained / 'checkpoints' / 'last.ckpt'}"
    from_folder = _evaluate(tmp_path / "folder", ckpt, f"data.root={image_folder}", f"data.backend={backend}")
    common = (ckpt, f"data.root={shards}", "data.format=tfrecord", f"data.backend={backend}")
    from_records = _evaluate(tmp_path / "records", *common)
    assert from_records["val.top1"] == from_folder["val.top1"]
    assert from_records["val.loss"] == pytest.approx(from_folder["val.loss"], rel=1e-5)
    # Other names than the records' own synsets (image/class/synset, as build_imagenet_data.py writes): refused.
    wrong = r"first record has label \d, synset class_\d, but the class names give label \d .* the name [abc] "
    with pytest.raises(DataError, match=wrong):
        _evaluate(tmp_path / "named", *common, "data.class_names=[c,b,a]")
    with pytest.raises(DataError, match="has 4 classes that differ from the 3"):  # another count: no names to take
        _evaluate(tmp_path / "count", *common, "data.num_classes=4")


@pytest.mark.slow
def test_use_ema_evaluates_the_ema_weights(trained: Path, image_folder: Path, tmp_path: Path) -> None:
    last_row = read_report(trained)["epochs"][-1]
    assert last_row["val_ema.loss"] != last_row["val.loss"]  # otherwise this test could not tell them apart
    ckpt = f"ckpt={trained / 'checkpoints' / 'last.ckpt'}"
    metrics = _evaluate(tmp_path, ckpt, "use_ema=true", f"data.root={image_folder}")
    assert metrics["val.top1"] == last_row["val_ema.top1"]
    assert metrics["val.loss"] == pytest.approx(last_row["val_ema.loss"], rel=1e-6)


@pytest.mark.slow
def test_weights_export_and_plain_state_dict_evaluate_like_the_checkpoint(
    trained: Path, image_folder: Path, tmp_path: Path
) -> None:
    ckpt = trained / "checkpoints" / "last.ckpt"
    expected = _evaluate(tmp_path / "ckpt", f"ckpt={ckpt}", f"data.root={image_folder}")
    model = load_trained(ckpt)
    export_weights(model, tmp_path / "export.pt")  # metadata inside: no model= needed
    exported = _evaluate(tmp_path / "export", f"ckpt={tmp_path / 'export.pt'}", f"data.root={image_folder}")
    torch.save(model.net.state_dict(), tmp_path / "plain.pth")  # keys only: model= says what it is
    plain = _evaluate(
        tmp_path / "plain",
        f"ckpt={tmp_path / 'plain.pth'}",
        "model=resnet18",
        "model.arch=test_resnet",
        "model.image_size=32",
        f"data.root={image_folder}",
        "data.batch_size=8",
    )
    for result in (exported, plain):
        assert result["val.top1"] == expected["val.top1"]
        assert result["val.top5"] == expected["val.top5"]
        assert result["val.loss"] == pytest.approx(expected["val.loss"], rel=1e-5)


def test_no_ckpt_or_not_a_checkpoint_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ckpt=PATH is required"):
        _evaluate(tmp_path)
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="notes.ckpt is a text file, not a checkpoint"):
        _evaluate(tmp_path, f"ckpt={tmp_path / 'notes.ckpt'}")
    with pytest.raises(ConfigError, match=r"^trainer.devices=64 .*but this machine has \d+ (cores|GPU)"):
        _evaluate(tmp_path, f"ckpt={tmp_path / 'notes.ckpt'}", "trainer.devices=64")  # refused before it is read
    torch.save({"lr": 0.1}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="other.pt holds no state_dict"):
        _evaluate(tmp_path, f"ckpt={tmp_path / 'other.pt'}", "data.root=/nonexistent")


@pytest.mark.slow
def test_a_state_dict_of_another_architecture_lists_the_keys(trained: Path, tmp_path: Path) -> None:
    import torchvision

    torch.save(torchvision.models.resnet18(weights=None).state_dict(), tmp_path / "tv_resnet18.pth")
    model_cfg = OmegaConf.to_container(compose_config(["model=efficientnet_b0"]).model, resolve=True)
    with pytest.raises(CheckpointError, match=r"does not fit model efficientnet_b0: \d+ missing .* unexpected"):
        load_trained(tmp_path / "tv_resnet18.pth", model_cfg=model_cfg)


@pytest.fixture(scope="module")
def cli_errors(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("evaluate-errors")
    ckpt = trained / "checkpoints" / "last.ckpt"
    evaluate_py = str(ROOT / "evaluate.py")
    common = [f"hydra.run.dir={tmp / 'out'}", "trainer.enable_progress_bar=false"]
    return run_clis(
        {
            "missing": [evaluate_py, f"ckpt={tmp / 'nope.ckpt'}", *common],
            "other_arch": [evaluate_py, f"ckpt={ckpt}", "model=resnet50", *common],
        }
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "case, needles",
    [
        ("missing", ["nope.ckpt", "does not exist"]),
        ("other_arch", ["holds a test_resnet network, not model=resnet50"]),
    ],
)
def test_bad_checkpoints_are_one_line_errors(cli_errors: dict, case: str, needles: list[str]) -> None:
    assert_one_line_error(cli_errors[case], *needles)
