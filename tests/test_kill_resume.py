"""SIGKILL a real training process at chosen checkpoints (some during a checkpoint write), resume each time with
ckpt_path=last, and end with the same weights as an uninterrupted run: bitwise, on CPU."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from imgcls.training.checkpoint import check_resumable
from tests import warm_python
from tests.conftest import ROOT, make_image_folder, read_report, run_cli, tiny_overrides

# Where each of the 5 processes is killed: after its N-th last.ckpt is in place, or inside its N-th write (the temp
# file written, not renamed). Chosen by checkpoint count, not by time, so any machine's speed kills the same way.
KILL_POINTS = ("after:2", "write:1", "after:1", "after:3", "write:2")


def run_args(data: Path, run_dir: Path, *extra: str) -> list[str]:
    # 24 images / batch 8 = 3 steps per epoch, 4 epochs; last.ckpt every step (except an epoch's last batch,
    # whose checkpoint follows validation), so kills land mid-epoch and each resume makes a little progress.
    return [
        *tiny_overrides(data, "recipe.epochs=4", "callbacks.checkpoint.every_n_train_steps=1"),
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def wait_for(condition, proc: subprocess.Popen, timeout: float = 180) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            return True
        time.sleep(0.005)
    return False


def assert_readable(ckpt: Path) -> int:
    check_resumable(str(ckpt), "test_resnet", ["class_0", "class_1", "class_2"])  # the training path's own check
    return int(torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"])


def assert_same_final_weights(reference: Path, resumed: Path, steps: int) -> None:
    """Both checkpoints at STEPS optimizer steps, with bitwise-equal weights."""
    a = torch.load(reference, map_location="cpu", weights_only=False)
    b = torch.load(resumed, map_location="cpu", weights_only=False)
    assert a["global_step"] == b["global_step"] == steps
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torchvision", "dali_cpu"])
def test_sigkill_at_chosen_checkpoints_then_resume_gives_identical_weights(tmp_path: Path, backend: str) -> None:
    """dali_cpu resumes from each rank's DALI reader checkpoint in last.ckpt (DaliLoader.position): mid-epoch at
    the saved batch, and after an epoch's last step with the reader's next epoch."""
    data = make_image_folder(tmp_path / "data", classes=3, train_per_class=8, val_per_class=2)

    def args(data: Path, run_dir: Path, *extra: str) -> list[str]:
        return run_args(data, run_dir, f"data.backend={backend}", *extra)

    ref = run_cli("train.py", *args(data, tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr[-2000:]

    run_dir = tmp_path / "killed"
    last = run_dir / "checkpoints" / "last.ckpt"
    temps = lambda: list(last.parent.glob(".last.ckpt.imgcls.*.tmp"))  # noqa: E731 - storage.temp_prefix's names
    steps = []
    for k, point in enumerate(KILL_POINTS):
        marker = tmp_path / f"paused-{k}"
        proc = warm_python.start([ROOT / "tests" / "train_until_paused.py", marker, point,
                                  *args(data, run_dir, "ckpt_path=last")], env={"WANDB_MODE": "offline"})  # fmt: skip
        assert wait_for(marker.exists, proc), f"{point}: exit {proc.poll()}: {proc.stderr.read()[-2000:]}"
        assert bool(temps()) == point.startswith("write")  # a kill inside a write leaves the temp file
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        steps.append(assert_readable(last))  # never truncated, never unreadable
    # Each resumed process made the progress of its completed checkpoints: 2 + 0 + 1 + 3 + 1 steps.
    assert steps == sorted(steps) and steps[-1] == 7, steps

    final = run_cli("train.py", *args(data, run_dir, "ckpt_path=last"))
    assert final.returncode == 0, final.stderr[-2000:]
    assert_same_final_weights(tmp_path / "ref" / "checkpoints" / "last.ckpt", last, steps=12)
    # The run dir, its report and its CSV log continued instead of starting over.
    assert [r["epoch"] for r in read_report(run_dir)["epochs"]] == [0, 1, 2, 3]
    ref_steps = [r["step"] for r in read_report(tmp_path / "ref")["epochs"]]
    assert [r["step"] for r in read_report(run_dir)["epochs"]] == ref_steps
    assert len(list(run_dir.glob("**/metrics.csv"))) == 1


@pytest.mark.slow
def test_mid_epoch_resume_with_dataloader_workers_is_bitwise_exact(tmp_path: Path) -> None:
    """Each image's augmentation is seeded by (seed, epoch, index) (seeding.sample_seed), so a run stopped
    mid-epoch and resumed with 2 DataLoader worker processes ends with the same weights as one that was
    not stopped. (A worker's own RNG stream cannot be saved in a checkpoint.) The stop is trainer.max_steps
    inside an epoch, without step checkpoints: last.ckpt must then be saved after the final step, in
    mid-epoch state (callbacks/checkpoint.py LastCheckpoint), or the resumed run skips the epoch's rest."""
    data = make_image_folder(tmp_path / "data", classes=3, train_per_class=8, val_per_class=2)
    common = tiny_overrides(data, "data.num_workers=2")
    ref = run_cli("train.py", *common, f"hydra.run.dir={tmp_path / 'ref'}")
    assert ref.returncode == 0, ref.stderr[-2000:]
    run_dir = tmp_path / "resumed"
    stopped = run_cli("train.py", *common, "trainer.max_steps=4", f"hydra.run.dir={run_dir}")
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    last = run_dir / "checkpoints" / "last.ckpt"
    assert assert_readable(last) == 4  # the second of epoch 1's three steps: mid-epoch
    written = (run_dir / "config.yaml").stat().st_ino
    resumed = run_cli("train.py", *common, "ckpt_path=last", f"hydra.run.dir={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # config.yaml is renamed into place, not rewritten in place: other ranks (torchrun, srun) read it while rank 0
    # writes it, and a half-written one stopped a resumed 2-rank run ("holds a config.yaml that imgcls did not
    # write"). A new file has a new inode; a truncate-and-write keeps the old one.
    assert (run_dir / "config.yaml").stat().st_ino != written
    assert_same_final_weights(tmp_path / "ref" / "checkpoints" / "last.ckpt", last, steps=6)


@pytest.mark.slow
def test_ema_with_gradient_accumulation_resumes_to_the_uninterrupted_run(tmp_path: Path) -> None:
    """EMA (recipe.ema_decay) with gradient accumulation (global batch 2x the per-device one), stopped at an epoch
    end and resumed: the EMA weights equal the uninterrupted run's. The resumed first micro-batch, which steps no
    optimizer, averaged the restored weights in once more (77 EMA tensors differed, by up to 0.09)."""
    from imgcls.run.train import run
    from tests.conftest import compose_config

    data = make_image_folder(tmp_path / "data", classes=3, train_per_class=8, val_per_class=2)
    common = tiny_overrides(data, "recipe.ema_decay=0.9", "recipe.global_batch_size=16", "recipe.epochs=2")
    run(compose_config(common, run_dir=tmp_path / "through"))
    run(compose_config([*common, "trainer.max_epochs=1"], run_dir=tmp_path / "resumed"))
    run(compose_config([*common, "ckpt_path=last"], run_dir=tmp_path / "resumed"))
    through, resumed = (
        torch.load(tmp_path / name / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        for name in ("through", "resumed")
    )
    assert through["global_step"] == resumed["global_step"] > 0
    ema = [k for k in through["state_dict"] if k.startswith("ema.")]
    assert ema and all(torch.equal(through["state_dict"][k], resumed["state_dict"][k]) for k in through["state_dict"])
