"""A real 2-process gloo run of train.py on webdataset shards of uneven sizes (the torchvision path,
data/shards/stream.py): both ranks take the same number of steps (no all-reduce waits for a rank that ran
out of batches: the run finishes within the timeout), and validation counts every val sample exactly once
(one process evaluating the same checkpoint on the source folder gets identical numbers)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests import warm_python
from tests.conftest import ROOT, clean_env, compose_config, make_image_folder, read_report, tiny_overrides
from tests.test_shards_torchvision import shard_folder

TIMEOUT = 300  # a hang (one rank waiting in an all-reduce for a rank without batches) fails here


def _train(args: list[str], run_dir: Path, *extra: str) -> None:
    result = warm_python.run(
        [ROOT / "train.py", *args, f"hydra.run.dir={run_dir}", *extra],
        cwd=run_dir.parent,
        base_env=clean_env(),
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "global rank 1 of 2" in result.stdout + result.stderr  # two processes really ran


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    # 45 train images in shards of 20, 5, 13, 7: 2 ranks x 4 per device take 45 // 8 = 5 steps each, the same
    # on both ranks although no rank's range lines up with the shards; 21 val images in shards of 11, 3, 7
    # validate as 10 + 11, unpadded.
    tmp = tmp_path_factory.mktemp("uneven")
    folder = make_image_folder(tmp / "img", classes=3, train_per_class=15, val_per_class=7)
    shards = shard_folder(folder, tmp / "shards", "webdataset", [20, 5, 13, 7], [11, 3, 7])
    args = tiny_overrides(
        shards, "data.format=webdataset", "data.batch_size=4", "data.num_workers=0", "trainer.accelerator=cpu",
        "trainer.devices=2", "recipe.epochs=1", "recipe.warmup_epochs=0",
    )  # fmt: skip
    return folder, tmp, args


@pytest.fixture(scope="module")
def reference(uneven: tuple[Path, Path, list[str]]) -> Path:
    """The uninterrupted run, made once for both tests (whichever runs first: conftest's LONGEST_FIRST starts the
    resume test first). A second run into its dir would be refused, rightly: it would write step 0 over step 5."""
    _, tmp, args = uneven
    _train(args, tmp / "run")
    return tmp / "run"


@pytest.mark.slow
def test_two_processes_on_uneven_shards_take_equal_steps_and_validate_exactly(
    uneven: tuple[Path, Path, list[str]], reference: Path, tmp_path: Path
) -> None:
    folder, _, _ = uneven
    run_dir = reference
    epoch = read_report(run_dir)["epochs"][-1]
    assert epoch["step"] == 5
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 5

    from imgcls.run.evaluate import run as evaluate

    # evaluate.py's data.format/data.root overrides: the checkpoint's own val set, read from the folder.
    overrides = [
        f"ckpt={run_dir / 'checkpoints' / 'last.ckpt'}", "data.format=folder", f"data.root={folder}",
        "data.batch_size=4", f"output={tmp_path / 'eval.json'}", "trainer.enable_progress_bar=false",
    ]  # fmt: skip
    one = evaluate(compose_config(overrides, "evaluate", run_dir=tmp_path))
    assert one["val.top1"] == pytest.approx(epoch["val.top1"], abs=1e-6)
    assert one["val.loss"] == pytest.approx(epoch["val.loss"], rel=1e-5)  # a sample counted twice would move it


@pytest.mark.slow
def test_two_processes_stopped_inside_a_shard_resume_to_identical_weights_steps_and_lr(
    uneven: tuple[Path, Path, list[str]], reference: Path
) -> None:
    """Stopped after 3 of 5 steps (rank 0 is inside its second shard, rank 1 inside its first) and resumed with
    ckpt_path=last: the same step count, learning rate and final weights, bitwise, as the run that was not
    stopped (`reference`)."""
    _, tmp, args = uneven
    ref_dir, run_dir = reference, tmp / "resumed"
    _train(args, run_dir, "trainer.max_steps=3")
    stopped = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert stopped["global_step"] == 3
    _train(args, run_dir, "ckpt_path=last")
    ref = torch.load(ref_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    resumed = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert resumed["global_step"] == ref["global_step"] == 5
    lrs = [
        [group["lr"] for group in opt["param_groups"]]
        for opt in (ref["optimizer_states"][0], resumed["optimizer_states"][0])
    ]
    assert lrs[0] == lrs[1]
    assert resumed["lr_schedulers"] == ref["lr_schedulers"]
    for name, tensor in ref["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], tensor), name
