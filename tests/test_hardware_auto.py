"""hardware=auto, the default: the profile that fits this machine (imgcls/config/hardware.py).

Was: the default was hardware=cpu, so the headline command `python train.py model=resnext101_32x4d precision=amp
trainer.devices=8` trained on the CPU of an 8-GPU server (32 images a device, torchvision, 8 CPU processes) without
a word. The GPUs are mocked (torch.cuda's queries, as test_quantization_qat.py's device test does): the configs are
Hydra's real compositions, the profiles' values their YAML files'.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError

from imgcls import cli
from imgcls.bench import gpu_check
from imgcls.config.checks import check_config
from imgcls.config.hardware import hardware_for, resolve_auto_hardware
from imgcls.run.plan import describe, resolve_plan
from imgcls.run.train import run
from tests.conftest import assert_one_line_error, compose_config, run_cli

HEADLINE = ["model=resnext101_32x4d", "precision=amp", "trainer.devices=8"]


def gpus(monkeypatch: pytest.MonkeyPatch, count: int, name: str, memory_gib: float) -> None:
    """This process sees `count` GPUs named `name` with `memory_gib` GiB each."""
    properties = SimpleNamespace(name=name, total_memory=int(memory_gib * 2**30))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)


def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def test_auto_is_the_default_and_experiments_keep_their_own() -> None:
    assert compose_config([]).hardware.name == "auto"
    assert compose_config(["experiment=resnet50_dgx1v_amp_90e"]).hardware.name == "dgx1v"
    assert compose_config(["experiment=demo"]).hardware.name == "cpu"


def test_without_cuda_auto_is_the_cpu_profile_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    no_gpu(monkeypatch)
    cfg = compose_config(HEADLINE)
    with caplog.at_level(logging.INFO, logger="imgcls.config.hardware"):
        reason = resolve_auto_hardware(cfg)
    assert reason == "hardware=auto chose cpu: no CUDA GPU visible"
    assert (cfg.hardware.name, cfg.trainer.accelerator, cfg.data.backend) == ("cpu", "cpu", "torchvision")
    assert cfg.trainer.devices == 8  # the user's, as set
    assert OmegaConf.to_container(cfg.hardware.batch) == OmegaConf.to_container(
        compose_config(["hardware=cpu"]).hardware.batch
    )
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "trains on the CPU" in record.getMessage()
    assert "no CUDA GPU visible" in record.getMessage()


def test_headline_command_on_8_h200_is_dgxa100_on_8_gpus(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    cfg = compose_config(HEADLINE)
    with caplog.at_level(logging.INFO, logger="imgcls.config.hardware"):
        reason = resolve_auto_hardware(cfg)
    assert reason == (
        "hardware=auto chose dgxa100: 8x NVIDIA H200 (139 GiB), the largest batch table NVIDIA published (A100 80GB)"
    )
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.INFO, reason)]
    assert (cfg.hardware.name, cfg.trainer.accelerator, cfg.trainer.devices) == ("dgxa100", "gpu", 8)
    assert (cfg.data.backend, cfg.data.num_workers, cfg.data.pin_memory) == ("dali_cpu", 10, True)
    plan = resolve_plan(cfg, check_devices=True)  # against the mocked 8 GPUs
    assert (plan.per_device_batch, plan.global_batch, plan.world_size, plan.accumulation) == (128, 1024, 8, 1)
    check_config(cfg)


def test_every_visible_gpu_unless_trainer_devices_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 4, "NVIDIA A100-SXM4-80GB", 80)
    cfg = compose_config(["model=resnet50", "precision=amp"])
    assert "4x NVIDIA A100-SXM4-80GB (80 GiB), NVIDIA's batch table for A100 80GB" in resolve_auto_hardware(cfg)
    assert (cfg.hardware.devices, cfg.trainer.devices, resolve_plan(cfg).world_size) == (4, 4, 4)
    explicit = compose_config(["model=resnet50", "precision=amp", "trainer.devices=2"])
    resolve_auto_hardware(explicit)
    assert (explicit.trainer.devices, resolve_plan(explicit).world_size) == (2, 2)


@pytest.mark.parametrize(
    "name,memory,profile,backend",
    [
        ("Tesla V100-SXM2-16GB", 15.8, "dgx1v", "dali_cpu"),
        ("Tesla V100-SXM2-32GB", 31.7, "dgx1v_32g", "dali_cpu"),
        ("Tesla T4", 14.6, "t4", "torchvision"),
        ("NVIDIA H100 80GB HBM3", 79.2, "dgxa100", "dali_cpu"),
        ("NVIDIA B200", 178, "dgxa100", "dali_cpu"),  # unknown: the largest table
    ],
)
def test_each_gpu_gets_the_profile_of_its_batch_table(
    monkeypatch: pytest.MonkeyPatch, name: str, memory: float, profile: str, backend: str
) -> None:
    gpus(monkeypatch, 8, name, memory)
    cfg = compose_config(["model=efficientnet_b0", "precision=amp"])
    resolve_auto_hardware(cfg)
    # The values of conf/hardware/PROFILE.yaml as composed (dgx1v_32g: its defaults list inherits dgx1v's).
    named = compose_config([f"hardware={profile}"]).hardware
    assert OmegaConf.to_container(cfg.hardware.batch) == OmegaConf.to_container(named.batch)
    assert (cfg.hardware.name, cfg.hardware.num_workers, cfg.data.backend) == (profile, named.num_workers, backend)
    assert hardware_for(name, memory) == profile


def test_dgx1v_32g_keeps_what_it_inherits_from_dgx1v(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 8, "Tesla V100-SXM2-32GB", 32)
    cfg = compose_config(["model=efficientnet_b0", "precision=amp"])
    resolve_auto_hardware(cfg)
    assert cfg.hardware.batch.efficientnet_b0.half.per_device == 256  # its own row (16 GB: 128)
    assert cfg.hardware.batch.resnet50.half.per_device == 256 and cfg.hardware.prefetch_factor == 4  # dgx1v's


def test_a_named_profile_is_never_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    for overrides, profile in [
        (["hardware=dgx1v"], "dgx1v"),
        (["hardware=cpu"], "cpu"),
        (["experiment=resnet50_dgx1v_amp_90e"], "dgx1v"),
        (["experiment=tf2_efficientnet_b0_8xv100_amp"], "dgx1v_32g"),
    ]:
        cfg = compose_config(overrides)
        before = OmegaConf.to_container(cfg)
        assert resolve_auto_hardware(cfg) is None
        assert cfg.hardware.name == profile and OmegaConf.to_container(cfg) == before


def test_what_the_user_set_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    """data.backend and trainer.* set by the user are no interpolation of the profile; hardware.* keys set on top of
    auto are carried over to the chosen profile."""
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    cfg = compose_config(["data.backend=torchvision", "hardware.num_workers=16", "hardware.devices=2"])
    resolve_auto_hardware(cfg)
    assert (cfg.hardware.name, cfg.data.backend, cfg.data.num_workers) == ("dgxa100", "torchvision", 16)
    assert (cfg.trainer.devices, cfg.hardware.prefetch_factor) == (2, 4)


def test_resolving_twice_changes_nothing_and_struct_mode_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    cfg = compose_config(HEADLINE)
    reason = resolve_auto_hardware(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)  # every ${hardware.*} resolves against the new node
    assert resolve_auto_hardware(cfg) == reason and OmegaConf.to_container(cfg, resolve=True) == resolved
    assert cfg.hardware.auto == reason  # kept in the run's config.yaml
    assert OmegaConf.is_struct(cfg)
    with pytest.raises(ConfigAttributeError):
        cfg.hardware.typo = 1


def test_plan_of_an_auto_run_names_the_accelerator_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    summary = describe(compose_config(HEADLINE))
    assert (summary["hardware"], summary["accelerator"], summary["data.backend"]) == ("dgxa100", "gpu", "dali_cpu")
    assert summary["hardware_auto"].startswith("hardware=auto chose dgxa100: 8x NVIDIA H200")
    assert (summary["per_device_batch"], summary["global_batch"], summary["world_size"]) == (128, 1024, 8)
    named = describe(compose_config(["hardware=dgxa100"]))
    assert named["accelerator"] == "gpu" and "hardware_auto" not in named


def test_a_sweep_refuses_in_process_ddp_on_an_auto_gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's DDP refusal looks at the resolved profile: auto's unresolved node says 1 device (cpu's)."""
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    monkeypatch.setattr(cli, "_in_multirun", lambda: True)
    monkeypatch.setattr(cli.HydraConfig, "get", staticmethod(lambda: SimpleNamespace(launcher={})))
    with pytest.raises(SystemExit):
        cli.refuse_in_process_ddp_sweep(compose_config([]))
    cli.refuse_in_process_ddp_sweep(compose_config(["trainer.devices=1"]))  # one process per job: fine


def test_gpu_check_uses_the_one_rule() -> None:
    assert gpu_check.hardware_for is hardware_for


def test_headline_command_in_process_on_a_cpu_machine_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """imgcls.run.train.run resolves auto itself (tests and the training benchmark call it without the CLI)."""
    no_gpu(monkeypatch)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with pytest.raises(SystemExit) as exit_info:
        cli.guarded(run, compose_config(HEADLINE, run_dir=tmp_path / "run"))
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == ["imgcls: error: trainer.devices=8 CPU processes but this machine has 2 cores"]


@pytest.mark.slow
def test_headline_command_on_this_cpu_machine(tmp_path: Path) -> None:
    """A real process: mode=plan prints the CPU plan and why; a training run on 2 cores ends with the one-line
    error naming trainer.devices, after the warning that it would train on the CPU."""
    plan = run_cli("train.py", "mode=plan", *HEADLINE, f"hydra.run.dir={tmp_path / 'plan'}")
    assert plan.returncode == 0, plan.stderr[-2000:]
    lines = dict(line.split(None, 1) for line in plan.stdout.splitlines() if line.strip() and line[0] != "[")
    if torch.cuda.is_available():  # a GPU machine: its own profile
        assert lines["accelerator"] == "gpu" and lines["hardware_auto"].startswith("hardware=auto chose ")
    else:
        assert (lines["hardware"], lines["accelerator"], lines["world_size"]) == ("cpu", "cpu", "8")
        assert lines["hardware_auto"] == "hardware=auto chose cpu: no CUDA GPU visible"
        assert "trains on the CPU" in plan.stdout + plan.stderr
    if torch.cuda.is_available() or (os.cpu_count() or 1) >= 8:
        return  # the error below is a CPU machine's with fewer than 8 cores (this one's: 2)
    train = run_cli("train.py", *HEADLINE, "data=synthetic", f"hydra.run.dir={tmp_path / 'train'}")
    assert_one_line_error(train, "trainer.devices=8", "cores")
    assert "no CUDA GPU visible, so this run trains on the CPU" in train.stdout + train.stderr
