"""Every command's arguments are checked as train.py's are: a bad value, a `--flag value` in argparse's style, a file
that is no checkpoint, a folder given as ckpt: one line naming the key, the value and what is allowed, exit code
2, never a traceback. `--help` starts with how to call the command and lists only the options a user picks.
Real processes of the real commands."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, assert_one_line_error, run_clis

CLASSIFY = ["-m", "imgcls.classify"]
EXPORT = ["-m", "imgcls.export"]
EVALUATE = [str(ROOT / "evaluate.py")]
TRAIN = [str(ROOT / "train.py")]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("arguments")
    runs = tmp / "runs"  # a folder of run dirs, as outputs/demo is
    for run in ("2026-01-01_10-00-00", "2026-01-02_10-00-00"):
        (runs / run / "checkpoints").mkdir(parents=True)
        (runs / run / "checkpoints" / "last.ckpt").write_bytes(b"not read")
    (tmp / "no_checkpoints").mkdir()
    photo = ROOT / "README.md"  # classify's images are read after its arguments are checked
    ckpt = runs / "2026-01-01_10-00-00" / "checkpoints" / "last.ckpt"
    classify = [*CLASSIFY, str(ckpt), str(photo)]
    jpeg = _jpeg(tmp / "photo.jpg")

    def evaluate(name: str) -> list[str]:  # each its own run dir: a failed run's is removed while others start
        return [*EVALUATE, f"data.root={tmp}", f"hydra.run.dir={tmp / 'evaluate_runs' / name}"]

    cases = {
        "topk=-1": [*classify, "topk=-1"],
        "topk=abc": [*classify, "topk=abc"],
        "topk=0": [*classify, "topk=0"],
        "batch_size=abc": [*classify, "batch_size=abc"],
        "json=maybe": [*classify, "json=maybe"],
        "--topk 3": [*classify, "--topk", "3"],
        "--use-ema": [*classify, "--use-ema"],
        "train --epochs 3": [*TRAIN, "--epochs", "3"],
        "train --arch resnet50": [*TRAIN, "--arch", "resnet50"],
        "evaluate --data-backend dali_cpu": [*EVALUATE, "ckpt=x", "--data-backend", "dali_cpu"],
        "export opset=abc": [*EXPORT, f"ckpt={ckpt}", "opset=abc"],
        "export use_ema=maybe": [*EXPORT, f"ckpt={ckpt}", "use_ema=maybe"],
        "export format=tflite": [*EXPORT, f"ckpt={ckpt}", "format=tflite"],
        "ckpt=README.md": [*evaluate("readme"), f"ckpt={ROOT / 'README.md'}"],
        "ckpt=JPEG": [*evaluate("jpeg"), f"ckpt={jpeg}"],
        "ckpt=runs": [*evaluate("runs"), f"ckpt={runs}"],
        "ckpt=no_checkpoints": [*evaluate("none"), f"ckpt={tmp / 'no_checkpoints'}"],
        "classify ckpt=folder": [*CLASSIFY, str(runs), str(photo)],
        **{f"{name} --help": [*argv, "--help"] for name, argv in
           (("train", TRAIN), ("evaluate", EVALUATE), ("classify", CLASSIFY), ("export", EXPORT))},
    }  # fmt: skip
    done = run_clis(cases)
    done["tmp"] = subprocess.CompletedProcess([], 0, str(tmp), "")  # where the files are, for the tests below
    return done


def _jpeg(path: Path) -> Path:
    from PIL import Image

    Image.new("RGB", (8, 8)).save(path)
    return path


@pytest.mark.parametrize(
    ("case", "needles"),
    [
        ("topk=-1", ["topk=-1", "must be a positive integer"]),
        ("topk=abc", ["topk=abc", "must be a positive integer"]),
        ("topk=0", ["topk=0", "must be a positive integer"]),
        ("batch_size=abc", ["batch_size=abc", "must be a positive integer"]),
        ("json=maybe", ["json=maybe", "must be true or false"]),
        ("export opset=abc", ["opset=abc", "must be a positive integer"]),
        ("export use_ema=maybe", ["use_ema=maybe", "must be true or false"]),
        ("export format=tflite", ["format=tflite", "weights, onnx, torchscript, int8, triton"]),
    ],
)
def test_a_bad_value_is_one_line_naming_key_value_and_what_is_allowed(
    results: dict[str, subprocess.CompletedProcess], case: str, needles: list[str]
) -> None:
    assert_one_line_error(results[case], *needles)


@pytest.mark.parametrize(
    ("case", "override"),
    [
        ("--topk 3", "use topk=3"),
        ("--use-ema", "use use_ema=true"),
        ("train --epochs 3", "use recipe.epochs=3"),
        ("train --arch resnet50", "use model=resnet50"),
        ("evaluate --data-backend dali_cpu", "use data.backend=dali_cpu"),
    ],
)
def test_a_flag_in_argparse_style_is_answered_with_the_override_to_type(
    results: dict[str, subprocess.CompletedProcess], case: str, override: str
) -> None:
    assert_one_line_error(results[case], "not --flags", override)


def test_a_file_that_is_no_checkpoint_is_named_for_what_it_is(results: dict[str, subprocess.CompletedProcess]) -> None:
    assert_one_line_error(results["ckpt=README.md"], "README.md is a Markdown file, not a checkpoint")
    assert_one_line_error(results["ckpt=JPEG"], "is a JPEG image, not a checkpoint")
    for case in ("ckpt=README.md", "ckpt=JPEG"):
        assert "Python objects" not in results[case].stderr


def test_a_folder_as_ckpt_lists_the_checkpoints_in_it(results: dict[str, subprocess.CompletedProcess]) -> None:
    tmp = Path(results["tmp"].stdout)
    newest, older = (
        tmp / "runs" / run / "checkpoints" / "last.ckpt" for run in ("2026-01-02_10-00-00", "2026-01-01_10-00-00")
    )
    assert_one_line_error(results["ckpt=runs"], f"ckpt={tmp / 'runs'} is a folder", "newest first")
    line = results["ckpt=runs"].stderr
    assert str(newest) in line and str(older) in line  # both, and both a user can pass as they are
    assert_one_line_error(results["classify ckpt=folder"], "is a folder", str(older))
    assert_one_line_error(results["ckpt=no_checkpoints"], "is a folder and holds no checkpoint")
    # Each evaluate failed before its first batch: the run dir Hydra made for it is gone.
    assert list((tmp / "evaluate_runs").iterdir()) == []


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        ("train", "usage: python train.py"),
        ("evaluate", "usage: python evaluate.py ckpt=PATH data.root=DIR"),
        ("classify", "usage: python -m imgcls.classify CKPT IMAGE_OR_DIR..."),
        ("export", "usage: python -m imgcls.export ckpt=PATH format="),
    ],
)
def test_help_starts_with_the_usage_and_lists_no_internal_option(
    results: dict[str, subprocess.CompletedProcess], command: str, usage: str
) -> None:
    result = results[f"{command} --help"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(usage), result.stdout[:300]
    groups = result.stdout.split("Config groups (GROUP=OPTION):")[1].split("\n\n")[0]
    assert "_base" not in groups and "_nvidia_pytorch" not in groups and "_tf1" not in groups
    assert "model: " in groups and "resnet50" in groups
