"""evaluate.py reads only what the user names: a data.root that is missing or empty stays so (the demo's digits are
written by training into the demo's own root, never by evaluate into the root it is given), the mistake is one
line with exit code 2, and the run leaves no run dir behind. For both kinds of checkpoint: one trained on the
demo's digits (data=demo) and one trained on a folder dataset."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import warm_python
from tests.conftest import ROOT, assert_one_line_error, compose_config, tiny_run


@pytest.fixture(scope="module")
def demo_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A checkpoint of `python train.py experiment=demo`, scaled down to two batches; and the demo root its
    training wrote (and marked)."""
    import imgcls.run.train

    base = tmp_path_factory.mktemp("demo")
    digits = base / "cache" / "digits-jpeg"
    overrides = [
        "experiment=demo", f"data.root={digits}", "model.arch=test_resnet", "recipe.epochs=1",
        "recipe.warmup_epochs=0", "trainer.limit_train_batches=2", "trainer.limit_val_batches=2",
        "data.num_workers=0", "callbacks.progress_bar=none", "trainer.enable_progress_bar=false",
    ]  # fmt: skip
    imgcls.run.train.run(compose_config(overrides, run_dir=base / "run"))
    assert (digits / ".complete").is_file()  # the demo's own root: written and marked by training
    return base / "run" / "checkpoints" / "last.ckpt", digits


@pytest.fixture(scope="module")
def folder_checkpoint(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    return tiny_run(tmp_path_factory, image_folder) / "checkpoints" / "last.ckpt"


def _evaluate(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """evaluate.py in cwd, with Hydra's default run dir (cwd/outputs/evaluate/TIME), as a user runs it."""
    return warm_python.run([ROOT / "evaluate.py", "trainer.enable_progress_bar=false", *args], cwd=cwd)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["demo", "folder"])
def test_a_missing_or_empty_data_root_stays_so_and_no_run_dir_is_left(
    kind: str, demo_checkpoint: tuple[Path, Path], folder_checkpoint: Path, tmp_path: Path
) -> None:
    ckpt = demo_checkpoint[0] if kind == "demo" else folder_checkpoint
    missing, empty, cwd = tmp_path / "nonexistent", tmp_path / "empty", tmp_path / "work"
    empty.mkdir()
    cwd.mkdir()
    results = {
        "missing": _evaluate(cwd, f"ckpt={ckpt}", f"data.root={missing}"),
        "empty": _evaluate(cwd, f"ckpt={ckpt}", f"data.root={empty}"),
    }
    assert_one_line_error(results["missing"], f"data.root={missing}", "does not exist")
    assert_one_line_error(results["empty"], f"data.root={empty}")
    assert not missing.exists()  # no folder made, no digits written into it
    assert list(empty.iterdir()) == []
    # The runs failed before their first batch: neither left a run dir (nor outputs/ itself) in the working dir.
    assert list(cwd.iterdir()) == []


@pytest.mark.slow
def test_the_demo_checkpoint_evaluates_on_the_digits_root_it_is_given(
    demo_checkpoint: tuple[Path, Path], tmp_path: Path
) -> None:
    """The root that training wrote the digits into is a folder dataset like any other; evaluate names the file it
    wrote, on stderr, so that stdout stays the JSON document."""
    ckpt, digits = demo_checkpoint
    before = sorted(p.relative_to(digits) for p in digits.rglob("*"))
    result = _evaluate(tmp_path, f"ckpt={ckpt}", f"data.root={digits}")
    assert result.returncode == 0, result.stderr[-2000:]
    written = [line for line in result.stderr.splitlines() if line.startswith("imgcls: wrote ")]
    assert len(written) == 1, result.stderr[-2000:]
    eval_json = Path(written[0].removeprefix("imgcls: wrote "))
    assert eval_json.name == "eval.json" and eval_json.is_relative_to(tmp_path / "outputs" / "evaluate")
    document = json.loads(eval_json.read_text())
    assert document["data.root"] == str(digits) and 0 <= document["val.top1"] <= 100
    assert sorted(p.relative_to(digits) for p in digits.rglob("*")) == before  # read, not written
