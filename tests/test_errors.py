"""Bad input: one clear line naming the key, the value and what is allowed; exit code 2; no traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imgcls.cli import guarded
from imgcls.run.train import run
from tests.conftest import (
    ROOT,
    assert_one_line_error,
    compose_config,
    make_image_folder,
    run_cli,
    run_clis,
    tiny_overrides,
)


class InProcess:
    """The same path as the CLI (imgcls.cli.guarded around imgcls.run.train.run), without paying for a
    fresh interpreter per case: a SystemExit code and the captured stderr."""

    def __init__(self, returncode: int, stderr: str) -> None:
        self.returncode, self.stderr = returncode, stderr


def train_in_process(capsys: pytest.CaptureFixture, overrides: list[str], tmp_path: Path) -> InProcess:
    with pytest.raises(SystemExit) as exit_info:
        guarded(run, compose_config(overrides, run_dir=tmp_path / "run"))
    return InProcess(exit_info.value.code, capsys.readouterr().err)


@pytest.mark.slow
@pytest.mark.parametrize(
    "override,allowed",
    [
        ("model=resnet51", "resnet50"),
        ("precision=fp16", "amp, bf16, fp32, tf32"),
        ("hardware=dgx3", "dgx1v, dgx1v_32g, dgx2v, dgxa100"),
        ("recipe=100e", "250e, 50e, 90e, efficientnet"),
        ("data=cifar", "demo, folder, imagenet, synthetic"),
    ],
)
def test_unknown_group_choice(override: str, allowed: str) -> None:
    result = run_cli("train.py", override)
    assert_one_line_error(result, override, "allowed:", allowed)


@pytest.mark.slow
def test_a_bad_value_ends_before_torch_is_imported(tmp_path: Path) -> None:
    """The commands import torch, timm and Lightning only for a config that passed its checks: a bad value costs
    ~0.6 s of CPU instead of ~7 s (imgcls.cli). Was: imgcls.cli imported every command's module first."""
    code = (
        "import sys\n"
        "from imgcls.cli import train_main\n"
        f"sys.argv = ['train.py', 'recipe.epochs=0', 'hydra.run.dir={tmp_path}']\n"
        "try:\n    train_main()\n"
        "except SystemExit as exc:\n    print(exc.code, sorted({'torch', 'timm', 'lightning'} & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "2 []", (result.stdout, result.stderr[-1500:])
    assert "imgcls: error: recipe.epochs=0 must be a positive integer" in result.stderr


@pytest.mark.slow
def test_unknown_choice_inside_a_sweep() -> None:
    assert_one_line_error(run_cli("train.py", "-m", "model=resnet50,resnet5O"), "model=resnet5O")


@pytest.fixture(scope="module")
def command_line_mistakes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    """Each command with a mistake on its command line, run at once (tests/test_overrides.py has the other
    mistakes, in process). Each was Hydra's multi-line message and exit code 1, or (`+modle=`) a run."""
    run_dir = f"hydra.run.dir={tmp_path_factory.mktemp('mistakes')}"
    return run_clis(
        {
            "modle=resnet50": [str(ROOT / "train.py"), "modle=resnet50", "mode=plan", run_dir],
            "+modle=resnet50": [str(ROOT / "train.py"), "+modle=resnet50", "mode=plan", run_dir],
            "trainer.precision=16": [str(ROOT / "train.py"), "trainer.precision=16", "mode=plan", run_dir],
            "model=[a": [str(ROOT / "evaluate.py"), "model=[a", run_dir],
            "data.rot": [str(ROOT / "evaluate.py"), "ckpt=x.ckpt", "data.rot=/data", run_dir],
            "classify precision": ["-m", "imgcls.classify", "x.ckpt", "a.jpg", "precision=amp"],
            "--config-dir": [str(ROOT / "train.py"), "--config-dir", "/no/such/conf", "mode=plan", run_dir],
        }
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "case,line",
    [
        ("modle=resnet50", "modle=resnet50: modle is not a config key; did you mean model=resnet50?"),
        ("+modle=resnet50", "+modle=resnet50: modle is not a config key; did you mean model=resnet50?"),
        ("trainer.precision=16", "trainer.precision is set by imgcls; use precision=amp|bf16|tf32|fp32"),
        ("model=[a", "cannot parse the override model=[a (no viable alternative at input '[a')"),
        ("data.rot", "data.rot=/data: data.rot is not a key of data; did you mean data.root=/data?"),
        ("classify precision", "precision=amp: classify has no config group precision (its groups: model)"),
        ("--config-dir", "--config-dir /no/such/conf is not a folder; it names a folder of config groups"),
    ],
)
def test_a_command_line_mistake_is_one_line(command_line_mistakes: dict, case: str, line: str) -> None:
    result = command_line_mistakes[case]
    assert_one_line_error(result, line)
    assert len(result.stderr.splitlines()) == 1, result.stderr  # and nothing else on stderr
    assert result.stdout == ""  # nothing ran (mode=plan prints its plan)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"), classes=2, train_per_class=4, val_per_class=2)


def train_args(root: Path, tmp_path: Path, *extra: str) -> list[str]:
    return tiny_overrides(root, *extra)


def test_missing_data_root(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    result = train_in_process(capsys, ["data=folder", "hardware=cpu"], tmp_path)
    assert_one_line_error(result, "data.root must be set")


def test_data_root_that_does_not_exist(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    result = train_in_process(capsys, train_args(tmp_path / "nowhere", tmp_path), tmp_path)
    assert_one_line_error(result, f"data.root={tmp_path / 'nowhere'} does not exist")


def test_a_url_as_an_image_folder_names_the_bucket_formats(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    result = train_in_process(capsys, ["debug=tiny", "data.root=s3://bucket/imagenet"], tmp_path)
    assert_one_line_error(result, "data.root=s3://bucket/imagenet is a URL", "data.format=webdataset or tfrecord")


def test_split_without_class_folders(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    (tmp_path / "empty" / "train").mkdir(parents=True)
    (tmp_path / "empty" / "val").mkdir(parents=True)
    result = train_in_process(capsys, train_args(tmp_path / "empty", tmp_path), tmp_path)
    assert_one_line_error(result, "has no class folders", "<class>")


def test_root_without_a_val_split(capsys: pytest.CaptureFixture, tmp_path: Path, folder: Path) -> None:
    root = tmp_path / "noval"
    shutil.copytree(folder / "train", root / "train")
    assert_one_line_error(train_in_process(capsys, train_args(root, tmp_path), tmp_path), "has no 'val' folder")


def test_val_classes_that_differ_from_train(capsys: pytest.CaptureFixture, tmp_path: Path, folder: Path) -> None:
    root = tmp_path / "mismatch"
    shutil.copytree(folder, root)
    (root / "val" / "class_1").rename(root / "val" / "class_9")
    result = train_in_process(capsys, train_args(root, tmp_path), tmp_path)
    assert_one_line_error(result, "val classes differ from train classes", "class_9")


@pytest.mark.parametrize("batch", ["0", "-4"])
def test_non_positive_batch_size(capsys: pytest.CaptureFixture, tmp_path: Path, folder: Path, batch: str) -> None:
    result = train_in_process(capsys, train_args(folder, tmp_path, f"data.batch_size={batch}"), tmp_path)
    assert_one_line_error(result, f"data.batch_size={batch} must be a positive integer")


def test_global_batch_not_divisible_by_per_device_batch(
    capsys: pytest.CaptureFixture, tmp_path: Path, folder: Path
) -> None:
    result = train_in_process(
        capsys, train_args(folder, tmp_path, "data.batch_size=6", "recipe.global_batch_size=16"), tmp_path
    )
    assert_one_line_error(result, "recipe.global_batch_size=16 is not a multiple", "6 x 1 = 6")


def test_gpu_hardware_profile_on_a_cpu_machine(capsys: pytest.CaptureFixture, tmp_path: Path, folder: Path) -> None:
    result = train_in_process(capsys, train_args(folder, tmp_path, "hardware=dgxa100"), tmp_path)
    assert_one_line_error(result, "no CUDA GPU", "hardware=cpu")


def test_more_cpu_processes_than_cores(capsys: pytest.CaptureFixture, tmp_path: Path, folder: Path) -> None:
    result = train_in_process(capsys, train_args(folder, tmp_path, "trainer.devices=64"), tmp_path)
    assert_one_line_error(result, "trainer.devices=64", "cores")


def test_unknown_backend(capsys: pytest.CaptureFixture, tmp_path: Path, folder: Path) -> None:
    result = train_in_process(capsys, train_args(folder, tmp_path, "data.backend=ffcv"), tmp_path)
    assert_one_line_error(result, "data.backend=ffcv", "torchvision")


@pytest.mark.slow
def test_resume_from_a_checkpoint_of_another_architecture(
    capsys: pytest.CaptureFixture, tmp_path: Path, folder: Path
) -> None:
    # In process (the CLI's guarded path; test_bad_value_is_one_line_and_exit_2 covers a real process): three
    # train.py starts cost ~20 s of CPU in imports alone.
    run(compose_config(train_args(folder, tmp_path, "recipe.epochs=1"), run_dir=tmp_path / "run"))
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    capsys.readouterr()  # the first run's output
    other = train_in_process(capsys, train_args(folder, tmp_path, "model=resnet34", f"ckpt_path={ckpt}"), tmp_path)
    assert_one_line_error(other, "is for model test_resnet, not resnet34; resume it with model.arch=test_resnet")
    three = make_image_folder(tmp_path / "three", classes=3, train_per_class=4, val_per_class=2)
    classes = train_in_process(capsys, train_args(three, tmp_path, f"ckpt_path={ckpt}"), tmp_path)
    assert_one_line_error(classes, "trained on 2 classes", "model.weights=")
    assert ckpt.stat().st_size > 0  # nothing lost


def test_checkpoint_path_that_is_not_a_checkpoint(capsys: pytest.CaptureFixture, tmp_path: Path, folder: Path) -> None:
    bogus = tmp_path / "notes.ckpt"
    bogus.write_text("not a checkpoint")
    result = train_in_process(capsys, train_args(folder, tmp_path, f"ckpt_path={bogus}"), tmp_path)
    assert_one_line_error(result, "is not a readable checkpoint")


@pytest.mark.slow
def test_a_resolver_refusing_a_value_is_one_line(tmp_path: Path) -> None:
    """imgcls's resolvers raise ConfigError inside OmegaConf's interpolation, which wraps it in its own
    InterpolationResolutionError (a traceback before): an experiment file of one's own naming a published run
    that does not exist."""
    expected = "expected=${imgcls.published:resnet50_dgx9_amp_90e,expected}"
    result = run_cli("train.py", "experiment=demo", expected, "mode=plan", f"hydra.run.dir={tmp_path}")
    assert_one_line_error(result, "experiment=resnet50_dgx9_amp_90e has no row in published_runs.csv")
