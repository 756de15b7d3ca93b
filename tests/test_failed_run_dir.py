"""A train run that fails before its first optimizer step leaves no run dir behind: a dozen command-line mistakes
left nine dirs under outputs/train (Hydra's .hydra/, a log, an empty checkpoints/), which hid the real runs. A dir
that held anything before the run, or a run that made a step, is kept whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgcls.errors import TrainingError, UserError
from imgcls.run.rundir import HYDRA_ENTRIES, made_by_hydra_for
from imgcls.run.train import remove_failed_train_dir, run
from tests import warm_python
from tests.conftest import ROOT, compose_config, tiny_overrides


def _hydra_made(run_dir: Path) -> Path:
    """run_dir as Hydra leaves it before the task starts: .hydra/ with its three files, and the log."""
    for entry in sorted(HYDRA_ENTRIES):
        path = run_dir / entry
        if path.suffix:
            path.write_text("{}\n")
        else:
            path.mkdir(parents=True)
    (run_dir / "train.log").write_text("")
    return run_dir


@pytest.mark.slow
def test_mistakes_on_the_command_line_leave_no_run_dir(tmp_path: Path) -> None:
    """Real train.py processes, as a user runs them from a folder: the default outputs/train/<time>, a named
    hydra.run.dir that did not exist, and one that holds the user's file (kept, with that file)."""
    missing = tmp_path / "no-such-data"
    mistakes = {
        "root": ["data=folder", f"data.root={missing}", "hardware=cpu"],
        "devices": ["hardware=cpu", "trainer.devices=100000"],
        "named": ["data=folder", f"data.root={missing}", "hardware=cpu", f"hydra.run.dir={tmp_path / 'runs' / 'a'}"],
        "theirs": ["data=folder", f"data.root={missing}", "hardware=cpu", f"hydra.run.dir={tmp_path / 'mine'}"],
    }
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's\n")
    procs = {}
    for name, args in mistakes.items():
        (tmp_path / name).mkdir()
        procs[name] = warm_python.start([ROOT / "train.py", *args], env={"WANDB_MODE": "offline"}, cwd=tmp_path / name)
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 2, (name, err[-2000:])
        assert "imgcls: error:" in err and "Traceback" not in err, err[-2000:]
        train_dirs = tmp_path / name / "outputs" / "train"
        assert not train_dirs.exists() or list(train_dirs.iterdir()) == [], name
    assert not (tmp_path / "runs" / "a").exists()
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's\n"  # a dir that was there stays, whole
    assert (tmp_path / "mine" / ".hydra").is_dir()


def test_a_run_dir_hydra_made_is_removed_when_the_run_fails_before_its_first_step(
    tmp_path: Path, image_folder: Path
) -> None:
    run_dir = _hydra_made(tmp_path / "run")
    cfg = compose_config(tiny_overrides(tmp_path / "no-such-data"), run_dir=run_dir)
    with pytest.raises(UserError):
        run(cfg)
    assert not run_dir.exists()


@pytest.mark.slow
def test_a_run_that_made_a_step_keeps_its_run_dir(tmp_path: Path, image_folder: Path) -> None:
    """The loss turns non-finite after a few steps and no checkpoint was saved yet: the dir, with what the run
    logged, stays for the user to read."""
    run_dir = _hydra_made(tmp_path / "run")
    overrides = tiny_overrides(image_folder, "recipe.lr_per_256=1e12", "recipe.warmup_epochs=0")
    with pytest.raises(TrainingError):
        run(compose_config(overrides, run_dir=run_dir))
    assert (run_dir / "config.yaml").is_file() and (run_dir / ".hydra").is_dir()


def test_only_a_dir_of_hydras_files_is_this_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = _hydra_made(tmp_path / "fresh")
    assert made_by_hydra_for(fresh, "train")
    assert not made_by_hydra_for(fresh, "demo")  # demo.log would be its log, train.log someone else's
    resumed = _hydra_made(tmp_path / "resumed")
    (resumed / "checkpoints").mkdir()
    (resumed / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert not made_by_hydra_for(resumed, "train")
    assert not made_by_hydra_for(tmp_path / "bare", "train")  # no .hydra/: not made by Hydra for this run
    monkeypatch.chdir(fresh)
    assert not made_by_hydra_for(fresh, "train")  # hydra.run.dir=.: the current dir is never removed
    monkeypatch.chdir(tmp_path)
    (fresh / "checkpoints").mkdir()
    (fresh / "checkpoints" / "epoch_0001.ckpt").write_bytes(b"")  # written by the run after the start
    assert not remove_failed_train_dir(fresh) and fresh.is_dir()


def test_a_failed_run_removes_only_its_own_dir_and_empty_outputs_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dir Hydra made goes, with ./outputs/TASK/ and ./outputs/ left empty by it; a user's own folder above a
    run dir (hydra.run.dir=mine/run), empty or not, and a run dir holding anything else stay."""
    from imgcls.run.rundir import discard_failed_run

    monkeypatch.chdir(tmp_path)
    default = _hydra_made(tmp_path / "outputs" / "train" / "2026-11-29_05-00-00")
    assert discard_failed_run(default, "train")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # outputs/train/ and outputs/ were left empty
    (tmp_path / "mine").mkdir()  # the user's own empty folder
    mine = _hydra_made(tmp_path / "mine" / "run")
    assert discard_failed_run(mine, "train")
    assert (tmp_path / "mine").is_dir() and not mine.exists()
    kept = _hydra_made(tmp_path / "mine" / "kept")
    (kept / "notes.txt").write_text("the user's")
    assert not discard_failed_run(kept, "train") and (kept / "notes.txt").read_text() == "the user's"
