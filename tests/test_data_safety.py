"""imgcls never deletes, moves or overwrites a file it did not create.

Each place that deletes or renames (the demo dataset, the JSON report writer, the run-dir write probe)
is run next to, or at, a folder of the user's files that must come out byte-for-byte the same.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path

import pytest

import imgcls.data.demo as demo
from imgcls.errors import ConfigError, DataError, StorageError
from imgcls.storage import write_json_atomic
from imgcls.training.checkpoint import check_writable
from tests.conftest import assert_one_line_error, compose_config, read_report, run_cli, tiny_overrides


def users_files(folder: Path) -> Path:
    """A folder as a user would have it: a text file and a subfolder with a file of its own."""
    (folder / "thesis").mkdir(parents=True)
    (folder / "notes.txt").write_text("my notes, not imgcls's\n")
    (folder / "thesis" / "chapter1.tex").write_bytes(b"\\chapter{One}\n" * 100)
    return folder


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry under FOLDER (hidden ones too) with its bytes; None for folders."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


def demo_args(root: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        "experiment=demo", f"data.root={root}", f"hydra.run.dir={run_dir}", "data.num_workers=0",
        "callbacks.progress_bar=none", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
        *extra,
    ]  # fmt: skip


# --- the demo dataset -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("target", ["folder", "file"])
def test_demo_on_the_users_files_refuses_and_touches_nothing(tmp_path: Path, target: str) -> None:
    """`train.py experiment=demo data.root=DIR` on a folder of the user's files deleted it (exit 0); on a file
    it left a staging folder beside the file and a traceback. Both: one line, exit 2, nothing changed."""
    home = users_files(tmp_path / "home")
    root = home if target == "folder" else home / "notes.txt"
    before = snapshot(home)
    result = run_cli("train.py", *demo_args(root, tmp_path / "run"))
    assert_one_line_error(result, f"data.root={root}", "missing or empty folder, or one imgcls made")
    assert snapshot(home) == before
    # No staging folder left anywhere, and no run dir: a run that fails before its first step leaves none.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


@pytest.mark.slow
def test_demo_fills_an_empty_folder_and_trains(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    (tmp_path / "neighbour.txt").write_text("beside the demo folder\n")
    result = run_cli(
        "train.py",
        *demo_args(root, tmp_path / "run", "trainer.max_steps=1", "trainer.limit_val_batches=1", "recipe.epochs=1"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (root / demo.MARKER).is_file() and len(list(root.glob("*/*/*.jpg"))) == 1797
    assert read_report(tmp_path / "run")["epochs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "neighbour.txt", "run"]
    assert (tmp_path / "neighbour.txt").read_text() == "beside the demo folder\n"


def test_demo_is_reused_once_complete(tmp_path: Path) -> None:
    root = demo.ensure_demo_dataset(tmp_path / "digits")
    (root / "train" / "0" / "0000.jpg").write_bytes(b"marked")  # would be rewritten if the demo were rebuilt
    assert demo.ensure_demo_dataset(tmp_path / "digits") == root
    assert (root / "train" / "0" / "0000.jpg").read_bytes() == b"marked"


def _ensure(root: str) -> str:
    return str(demo.ensure_demo_dataset(root))


@pytest.mark.slow
def test_concurrent_callers_share_one_complete_demo(tmp_path: Path) -> None:
    """Several ranks start at once on a missing root: all get the same complete dataset, no staging remains."""
    root = tmp_path / "cache" / "digits"
    with multiprocessing.get_context("fork").Pool(3) as pool:
        results = pool.map(_ensure, [str(root)] * 3)
    assert set(results) == {str(root)}
    assert len(list(root.glob("*/*/*.jpg"))) == 1797 and (root / demo.MARKER).is_file()
    assert [p.name for p in root.parent.iterdir()] == ["digits"]


@pytest.mark.slow
def test_users_files_that_appear_while_the_demo_is_written_survive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old code rmtree'd ROOT when its rename failed; now the failed rename only removes imgcls's staging."""
    root = tmp_path / "digits"
    write = demo._write_digits

    def user_saves_meanwhile(folder: Path) -> None:
        write(folder)
        users_files(root)  # the user (or another program) creates ROOT while imgcls is writing

    monkeypatch.setattr(demo, "_write_digits", user_saves_meanwhile)
    with pytest.raises(DataError, match="is a folder with other files in it"):
        demo.ensure_demo_dataset(root)
    assert snapshot(root) == snapshot(users_files(tmp_path / "expected"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["digits", "expected"]


def test_parent_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(DataError, match="cannot create its parent folder"):
        demo.ensure_demo_dataset(tmp_path / "notes.txt" / "digits")
    assert (tmp_path / "notes.txt").read_text() == "mine\n" and len(list(tmp_path.iterdir())) == 1


# --- JSON reports (report.json, evaluate/benchmark output=) ---------------------------------------------
def test_json_report_never_touches_a_users_file_named_like_its_temp(tmp_path: Path) -> None:
    """The temp name was `.NAME.<pid>.tmp`, written with truncation: a user's file of that name was replaced."""
    home = users_files(tmp_path / "home")
    (home / f".eval.json.{os.getpid()}.tmp").write_text("the user's, by coincidence\n")
    before = snapshot(home)
    write_json_atomic(home / "eval.json", {"top1": 1.0})
    after = snapshot(home)
    assert after.pop("eval.json") == b'{\n  "top1": 1.0\n}\n'
    assert after == before
    assert (home / "eval.json").stat().st_mode & 0o777 == 0o666 & ~demo_umask()


def demo_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_json_report_onto_a_users_folder_is_one_line_and_leaves_no_temp(tmp_path: Path) -> None:
    home = users_files(tmp_path / "home")
    before = snapshot(tmp_path)
    with pytest.raises(StorageError, match=f"could not write {home}"):
        write_json_atomic(home, {"top1": 1.0})  # output= naming an existing folder
    assert snapshot(tmp_path) == before


# --- the run dir's write probe -----------------------------------------------------------------------------
def test_write_probe_never_removes_a_users_file_of_the_same_name(tmp_path: Path) -> None:
    checkpoints = users_files(tmp_path / "run" / "checkpoints")
    (checkpoints / f".write-probe-{os.getpid()}").write_text("the user's, by coincidence\n")
    before = snapshot(tmp_path)
    check_writable(tmp_path / "run")
    assert snapshot(tmp_path) == before


# --- exported models --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    from tests.conftest import tiny_run

    return tiny_run(tmp_path_factory, image_folder) / "checkpoints" / "last.ckpt"


def export_to(ckpt: Path, *overrides: str) -> dict:
    from imgcls.export import run as export

    return export(compose_config([f"ckpt={ckpt}", *overrides], config_name="export"))


@pytest.mark.slow
def test_export_never_replaces_a_users_file_at_its_default_path(checkpoint: Path, tmp_path: Path) -> None:
    """Without output=, the export goes beside the checkpoint: it replaced a user's model.onnx there."""
    home = users_files(tmp_path / "home")
    shutil.copy(checkpoint, home / "model.ckpt")
    (home / "model.onnx").write_bytes(b"the user's own ONNX model")
    before = snapshot(home)
    with pytest.raises(ConfigError, match=f"output={home / 'model.onnx'} .* already exists; pass output=PATH"):
        export_to(home / "model.ckpt", "format=onnx")
    assert snapshot(home) == before


@pytest.mark.slow
def test_export_onto_a_users_folder_is_one_line(checkpoint: Path, tmp_path: Path) -> None:
    home = users_files(tmp_path / "home")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="is a folder; give the path of the file to write"):
        export_to(checkpoint, f"output={home}")  # was IsADirectoryError, a traceback
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_export_writes_only_its_output(checkpoint: Path, tmp_path: Path) -> None:
    home = users_files(tmp_path / "home")
    before = snapshot(home)
    export_to(checkpoint, f"output={home / 'model.pt'}")
    after = snapshot(home)
    assert after.pop("model.pt").startswith(b"PK")  # a torch zip archive, renamed into place whole
    assert after == before  # no temp file left beside it
    assert (home / "model.pt").stat().st_mode & 0o777 == 0o666 & ~demo_umask()


# --- charts -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_plot_never_replaces_a_users_picture_of_the_same_name(tmp_path: Path) -> None:
    """The chart names (loss.png, ...) are imgcls's choice; --out (./plots for several runs) may hold the user's."""
    from tests.test_plot import fake_run, plot

    run_dir = fake_run(tmp_path / "run", 1.0)
    home = users_files(tmp_path / "home")
    (home / "loss.png").write_bytes(b"\x89PNG the user's own chart")
    before = snapshot(home)
    result = plot(str(run_dir), "--out", str(home))
    assert_one_line_error(result, f"--out {home}: loss.png there was not written by imgcls.plot")
    assert snapshot(home) == before
    for _ in range(2):  # its own charts are replaced when plotted again
        assert plot(str(run_dir)).returncode == 0


# --- the run dir ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["config.yaml", "report.json"])
def test_training_into_a_folder_with_the_users_file_of_a_run_file_name_refuses(
    capsys: pytest.CaptureFixture, tmp_path: Path, image_folder: Path, name: str
) -> None:
    """hydra.run.dir=. in a project folder: its config.yaml / report.json were replaced by the run's."""
    from tests.test_errors import train_in_process

    home = users_files(tmp_path / "run")  # train_in_process runs in TMP/run
    (home / name).write_text("the user's own file\n")
    before = snapshot(home)
    result = train_in_process(capsys, tiny_overrides(image_folder), tmp_path)
    assert_one_line_error(result, f"run_dir={home} holds a {name} that imgcls did not write")
    assert snapshot(home) == before
