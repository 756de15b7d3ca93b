"""A job its launcher restarts continues from its newest checkpoint, and no run writes a checkpoint of an earlier
step over a later one (issue 31 item 1). Real train.py processes; SLURM's and torchrun's restart counters as the
launchers set them; kills at chosen checkpoints (tests/train_until_paused.py), not at wall-clock moments."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from imgcls.callbacks.preemption import restarted_by
from imgcls.errors import CheckpointError
from imgcls.training.checkpoint import AtomicCheckpointIO
from tests import warm_python
from tests.conftest import ROOT, assert_one_line_error, clean_env, make_image_folder, run_cli, tiny_overrides
from tests.test_kill_resume import assert_same_final_weights, wait_for

# One SLURM task, as `sbatch` runs the batch script (the reproduction).
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "imgcls", "SLURM_PROCID": "0",
         "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"), classes=3, train_per_class=8, val_per_class=2)


def args(data: Path, run_dir: Path, *extra: str) -> list[str]:
    # 24 images / batch 8: 3 steps an epoch, 4 epochs; last.ckpt every step
    return [*tiny_overrides(data, "recipe.epochs=4", "callbacks.checkpoint.every_n_train_steps=1"),
            f"hydra.run.dir={run_dir}", *extra]  # fmt: skip


def train(argv: list[str], env: dict[str, str] | None = None):  # noqa: ANN201 - CompletedProcess
    return warm_python.run([ROOT / "train.py", *argv], base_env={**clean_env(), **(env or {})}, timeout=600)


def kill_after_checkpoint(argv: list[str], env: dict[str, str], count: int, marker: Path) -> None:
    proc = warm_python.start([ROOT / "tests" / "train_until_paused.py", marker, f"after:{count}", *argv],
                             base_env={**clean_env(), **env})  # fmt: skip
    assert wait_for(marker.exists, proc), proc.stderr.read()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def step_of(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def reference(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("reference")
    done = train(args(data, run_dir))
    assert done.returncode == 0, done.stderr[-2000:]
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["slurm", "torchrun"])
def test_a_restarted_job_continues_from_its_last_checkpoint(
    launcher: str, data: Path, reference: Path, tmp_path: Path
) -> None:
    """The same command again (no ckpt_path), as a SLURM requeue or torchrun's elastic agent runs it: the run goes on
    from step 5 instead of starting over and writing step 1 over step 5, and ends bitwise as an uninterrupted run."""
    run_dir = tmp_path / "run"
    first = {**SLURM} if launcher == "slurm" else {"TORCHELASTIC_RESTART_COUNT": "0"}
    kill_after_checkpoint(args(data, run_dir), first, 5, tmp_path / "paused")
    last = run_dir / "checkpoints" / "last.ckpt"
    assert step_of(last) == 5
    again = {**SLURM, "SLURM_RESTART_COUNT": "1"} if launcher == "slurm" else {"TORCHELASTIC_RESTART_COUNT": "1"}
    done = train(args(data, run_dir), again)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming from {last}" in done.stdout + done.stderr
    assert_same_final_weights(reference, last, steps=12)


@pytest.mark.slow
def test_an_old_requeue_checkpoint_loses_to_a_later_last_checkpoint(
    data: Path, reference: Path, tmp_path: Path
) -> None:
    """A requeue left hpc_ckpt_1.ckpt at step 4; the job then saved last.ckpt at step 8 and was requeued without a
    signal (node failure). Lightning's SLURM resume would take the hpc file; the run takes the newest by step."""
    run_dir = tmp_path / "run"
    kill_after_checkpoint(args(data, run_dir), SLURM, 4, tmp_path / "paused-1")
    shutil.copyfile(run_dir / "checkpoints" / "last.ckpt", run_dir / "hpc_ckpt_1.ckpt")
    kill_after_checkpoint(args(data, run_dir, "ckpt_path=last"), SLURM, 4, tmp_path / "paused-2")
    last = run_dir / "checkpoints" / "last.ckpt"
    assert (step_of(run_dir / "hpc_ckpt_1.ckpt"), step_of(last)) == (4, 8)
    done = train(args(data, run_dir), {**SLURM, "SLURM_RESTART_COUNT": "2"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming from {last}" in done.stdout + done.stderr
    assert_same_final_weights(reference, last, steps=12)


@pytest.mark.slow
def test_a_fresh_start_over_a_later_checkpoint_stops_in_one_line(data: Path, tmp_path: Path) -> None:
    """Not a restart (no launcher counter, no requeue file): a second `train.py` in the same run dir without
    ckpt_path would write step 1 over step 5. It stops before training, naming both, and leaves the file alone."""
    run_dir = tmp_path / "run"
    kill_after_checkpoint(args(data, run_dir), {}, 5, tmp_path / "paused")
    last = run_dir / "checkpoints" / "last.ckpt"
    before = sha(last)
    result = run_cli("train.py", *args(data, run_dir))
    assert result.returncode == 2
    assert_one_line_error(result, f"holds {last} at step 5", "starts at step 0", "ckpt_path=last", "hydra.run.dir")
    assert sha(last) == before


def test_a_checkpoint_of_an_earlier_step_never_replaces_a_later_one(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 10, "state_dict": {}}, path)
    other = AtomicCheckpointIO()  # another process: it did not write this file
    with pytest.raises(CheckpointError, match=f"{path} holds step 10 and this run is at step 5"):
        other.save_checkpoint({"global_step": 5, "state_dict": {}}, path)
    assert step_of(path) == 10
    other.save_checkpoint({"global_step": 10, "state_dict": {}}, path)  # the same step: a resumed save
    other.save_checkpoint({"global_step": 11, "state_dict": {}}, path)
    assert step_of(path) == 11


def test_the_launchers_restart_counters() -> None:
    assert restarted_by({}) is None
    assert restarted_by({"SLURM_JOB_ID": "1", "SLURM_RESTART_COUNT": "0"}) is None
    assert restarted_by({"SLURM_RESTART_COUNT": "2"}) == "SLURM requeue (SLURM_RESTART_COUNT=2)"
    assert restarted_by({"TORCHELASTIC_RESTART_COUNT": "1"}) == "torchrun (TORCHELASTIC_RESTART_COUNT=1)"
    assert os.environ.get("SLURM_RESTART_COUNT") is None or restarted_by() is not None
