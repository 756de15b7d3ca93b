"""`train.py mode=plan`: the resolved run of any experiment for any machine, without data or GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from imgcls.config.compose import options
from imgcls.run.plan import describe
from tests.conftest import compose_config, run_cli


@pytest.mark.slow
def test_plan_of_an_8_gpu_experiment_prints_on_a_cpu_machine(tmp_path: Path) -> None:
    result = run_cli("train.py", "mode=plan", "experiment=resnet50_dgxa100_amp_90e", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines() if line.strip())
    # NVIDIA's DGXA100 RN50 AMP 90E: 8 x 256 = 2048, LR 0.256 x 2048 / 256, WD 1/32768 (nvidia-convnets.md §2.2)
    assert (lines["world_size"], lines["per_device_batch"], lines["global_batch"]) == ("8", "256", "2048")
    assert float(lines["lr"]) == pytest.approx(2.048) and float(lines["weight_decay"]) == pytest.approx(1 / 32768)
    # 1,281,167 images / 8 ranks / 256 per batch = 625 steps an epoch, 90 epochs, 8 of them warmup.
    assert (lines["steps_per_epoch"], lines["total_steps"], lines["warmup_steps"]) == ("625", "56250", "5000")
    assert "77.12" in lines["expected"] and lines["precision"] == "amp"
    assert not (tmp_path / "checkpoints").exists()  # nothing of a training run is made


@pytest.mark.slow
def test_plan_prints_values_as_written_and_leaves_no_run_dir(tmp_path: Path) -> None:
    """A plan only reads the config: nothing is left in the current dir (Hydra made outputs/TASK/TIME with .hydra/
    and a log file), and values read as in a config: null, YAML's {k: v} (not None, {'top1': 77.12})."""
    from tests import warm_python
    from tests.conftest import ROOT

    for experiment in ("resnet50_dgxa100_amp_90e", "efficientnet_b0_dgxa100_amp_400e"):
        result = warm_python.run([ROOT / "train.py", "mode=plan", f"experiment={experiment}"], cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert list(tmp_path.iterdir()) == []
        assert "None" not in result.stdout and "'" not in result.stdout and "True" not in result.stdout
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines() if line.strip())
    assert lines["expected"].startswith("{top1: ") and "published_on: {model: efficientnet_b0, " in lines["expected"]
    result = warm_python.run([ROOT / "train.py", "mode=plan", "hardware=cpu"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert dict(line.split(None, 1) for line in result.stdout.splitlines())["expected"] == "null"
    assert list(tmp_path.iterdir()) == []


# demo: its digits are written at its first run, so its plan has no step counts before that.
@pytest.mark.slow
@pytest.mark.parametrize("experiment", [e for e in options("experiment") if e != "demo"])
def test_every_experiment_has_a_plan(experiment: str) -> None:
    cfg = compose_config([f"experiment={experiment}"])
    # task_name (the run dir outputs/TASK_NAME/<time> and its TASK_NAME.log) is the file name, which train.yaml
    # derives from Hydra's choice of experiment (test_configs.py: the demo's, and train without one).
    assert cfg.task_name == experiment
    plan = describe(cfg)
    assert plan["global_batch"] == plan["per_device_batch"] * plan["world_size"] * plan["accumulation"]
    assert plan["total_steps"] == plan["steps_per_epoch"] * plan["epochs"] and plan["warmup_steps"] > 0
    assert plan["lr"] > 0 and plan["weight_decay"] > 0
    assert plan["val_resize"] == plan["image_size"] + 32  # NVIDIA's eval protocol (data.val_crop_padding) in every run
    published = cfg.expected.get("published_on")
    if published is not None:  # the machine of `hours` is the experiment's own (a copy mode=plan keeps after overrides)
        own = (plan["model"], plan["hardware"], plan["precision"], plan["world_size"])
        assert (published.model, published.hardware, published.precision, published.gpus) == own


def test_plan_counts_the_train_folder_when_no_count_is_given(image_folder: Path) -> None:
    cfg = compose_config(["data=folder", f"data.root={image_folder}", "data.batch_size=8",
                          "recipe.global_batch_size=8", "hardware=cpu", "recipe.epochs=2"])  # fmt: skip
    plan = describe(cfg)
    assert (plan["train_images"], plan["steps_per_epoch"], plan["total_steps"]) == (48, 6, 12)
    assert plan["train_images_from"].startswith("files in ")


def test_the_published_time_is_scaled_to_another_machine_by_nvidias_throughput() -> None:
    """resnet50 AMP 90E: NVIDIA's 5 h on 8x V100 16GB (8322 img/s). On a DGX A100 (16621 img/s): 5 x 8322 / 16621;
    on one V100 (1200 img/s): 5 x 8322 / 1200. The published machine itself gets no estimate; a machine NVIDIA has
    no throughput for says so."""
    base = ["experiment=resnet50_dgx1v_amp_90e"]
    assert "expected_hours_here" not in describe(compose_config(base))
    a100 = describe(compose_config([*base, "hardware=dgxa100"]))["expected_hours_here"]
    assert a100.startswith(f"~{5 * 8322 / 16621:.1f} (an estimate: NVIDIA's 5 h on 8x dgx1v amp")
    one = describe(compose_config([*base, "trainer.devices=1"]))["expected_hours_here"]
    assert one.startswith(f"~{5 * 8322 / 1200:.1f} ")
    assert describe(compose_config([*base, "hardware=t4"]))["expected_hours_here"].startswith("no estimate")
