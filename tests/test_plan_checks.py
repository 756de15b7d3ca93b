"""`mode=plan` checks the machine as training does, and says which precision will run.

The headline command with `mode=plan` on a 2-core CPU machine printed world_size 8 and exit 0, and then training
stopped with `trainer.devices=8 CPU processes but this machine has 2 cores`; the plan said `precision amp` where
the run trains in bf16 without CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from imgcls.config.hardware import resolve_auto_hardware
from imgcls.errors import ConfigError
from imgcls.run.plan import describe, resolve_plan, show
from imgcls.training.precision import resolve_precision
from tests.conftest import assert_one_line_error, compose_config, run_cli


def _too_many_devices(power_of_two: bool = False) -> tuple[int, str]:
    """A trainer.devices this machine cannot run, and what training says about it (hardware=auto's profile). A power
    of two divides the global batches, so the plan itself can be made; one more than the machine has may not."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else os.cpu_count() or 1
    count = 2 ** have.bit_length() if power_of_two else have + 1
    if torch.cuda.is_available():
        return count, f"trainer.devices={count} but this machine has {have} GPU(s)"
    return count, f"trainer.devices={count} CPU processes but this machine has {have} cores"


@pytest.mark.slow
def test_the_headline_plan_fails_where_training_would_after_printing_the_plan(tmp_path: Path) -> None:
    devices, line = _too_many_devices(power_of_two=True)
    command = ["model=resnext101_32x4d", "precision=amp", f"trainer.devices={devices}", f"hydra.run.dir={tmp_path}"]
    command += [f"recipe.global_batch_size={256 * devices}"] if devices > 8 else []  # a plan on a many-core machine
    plan = run_cli("train.py", *command, "mode=plan")
    assert_one_line_error(plan, line)  # exit 2, one line, no traceback
    printed = dict(row.split(None, 1) for row in plan.stdout.splitlines() if row.strip())
    assert printed["world_size"] == str(devices) and printed["model"] == "resnext101_32x4d"  # the plan came first
    train = run_cli("train.py", *command)
    assert_one_line_error(train, line)
    assert [r for r in plan.stderr.splitlines() if r.startswith("imgcls: error:")] == [
        r for r in train.stderr.splitlines() if r.startswith("imgcls: error:")
    ]


@pytest.mark.parametrize("power_of_two", [True, False])
def test_a_plan_of_this_machine_stops_with_the_line_training_stops_with(
    power_of_two: bool, capsys: pytest.CaptureFixture
) -> None:
    """With devices that divide the batch the plan is printed first; with 3 devices on 2 cores (256 is no multiple of
    32 x 3) there is no plan, and the line is still the machine's, as training's is."""
    devices, line = _too_many_devices(power_of_two)
    overrides = [f"trainer.devices={devices}", *([f"recipe.global_batch_size={256 * devices}"] if power_of_two else [])]
    with pytest.raises(ConfigError) as planned:
        show(compose_config(overrides))  # hardware=auto: a plan of this machine
    assert str(planned.value) == line
    if power_of_two:
        assert "world_size" in capsys.readouterr().out  # printed before the refusal: what was planned
    cfg = compose_config(overrides)
    resolve_auto_hardware(cfg)  # as training does first
    with pytest.raises(ConfigError) as trained:
        resolve_plan(cfg)
    assert str(trained.value) == str(planned.value)  # one check, one line


@pytest.mark.skipif(torch.cuda.device_count() >= 8, reason="this machine can train the DGX A100 plan")
def test_a_plan_for_another_machine_prints_and_notes_what_training_here_would_refuse(
    capsys: pytest.CaptureFixture,
) -> None:
    """A named GPU profile plans for its machine (an 8-GPU plan on a laptop): exit 0, with a note."""
    summary = show(compose_config(["experiment=resnet50_dgxa100_amp_90e"]))
    assert summary["world_size"] == 8
    err = capsys.readouterr().err
    expected = "this machine has no CUDA GPU" if not torch.cuda.is_available() else "trainer.devices=8 but this"
    assert "imgcls: note: a plan for hardware=dgxa100's machine; training on this one would stop: " in err
    assert expected in err and "imgcls: error" not in err


@pytest.mark.parametrize(
    ("overrides", "runs_as"),
    [
        (["hardware=cpu", "precision=amp"], "bf16-mixed"),  # amp's fp16 needs CUDA
        (["hardware=cpu", "precision=amp", "precision.cpu_fp16=true"], "16-mixed"),
        (["hardware=cpu", "precision=fp32"], "32-true"),
        (["hardware=dgxa100", "precision=amp"], "16-mixed"),  # a plan for a GPU machine: what runs there
    ],
)
def test_the_plan_names_the_precision_that_will_run(overrides: list[str], runs_as: str) -> None:
    cfg = compose_config(overrides)
    planned = describe(cfg)["precision_runs_as"]
    assert planned.split()[0] == runs_as
    if runs_as == "bf16-mixed":
        assert "needs CUDA" in planned and "precision.cpu_fp16=true" in planned
        assert resolve_precision(cfg.precision, "cpu") == ("bf16-mixed", [])  # what training's Trainer gets
