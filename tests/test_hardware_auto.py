"""hardware=auto, the default: the profile that fits this machine (imgcls/config/hardware.py).

Was: the default was hardware=cpu, so the headline command `python train.py model=resnext101_32x4d precision=amp
trainer.devices=8` trained on the CPU of an 8-GPU server (32 images a device, torchvision, 8 CPU processes) without
a word. The GPUs are mocked (torch.cuda's queries, as test_quantization_qat.py's device test does): the configs are
Hydra's real compositions, the profiles' values their YAML files'.

Under a launcher (issue 39 item 5) trainer.devices was torch.cuda.device_count() and trainer.num_nodes stayed 1, so
torchrun with --nproc_per_node below the GPUs or --nnodes>1, and srun on several nodes, ended in the ValueError of
Lightning's cluster environment; the launchers' variables are set here, and Lightning's own validate_settings is
what the resolved values must pass. A node with mixed GPUs got GPU 0's (the largest card's) batch table.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError

from imgcls import cli
from imgcls.bench import gpu_check
from imgcls.config.checks import check_config
from imgcls.config.hardware import hardware_for, resolve_auto_hardware
from imgcls.errors import ConfigError
from imgcls.run.plan import describe, resolve_plan
from imgcls.run.train import run
from tests.conftest import assert_one_line_error, compose_config, run_cli

HEADLINE = ["model=resnext101_32x4d", "precision=amp", "trainer.devices=8"]


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """No launcher's variables from the environment pytest runs in (it may itself run under srun or torchrun)."""
    for key in list(os.environ):
        if key.startswith(("TORCHELASTIC", "SLURM")) or key in LAUNCHER_VARIABLES:
            monkeypatch.delenv(key)
    # A Trainer made under a mocked launcher sets Lightning's process-wide rank (SLURM_PROCID=3: rank 3); put back,
    # or the tests that run after these in this process write no logs (only rank zero does).
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", getattr(rank_zero_only, "rank", 0))


LAUNCHER_VARIABLES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_RANK", "CUDA_VISIBLE_DEVICES")


def gpus(monkeypatch: pytest.MonkeyPatch, count: int, name: str, memory_gib: float) -> None:
    """This process sees `count` GPUs named `name` with `memory_gib` GiB each."""
    mixed_gpus(monkeypatch, [(name, memory_gib)] * count)


def mixed_gpus(monkeypatch: pytest.MonkeyPatch, cards: list[tuple[str, float]]) -> None:
    """This process sees one GPU per (name, GiB) in `cards`, GPU i the i-th."""
    properties = [SimpleNamespace(name=name, total_memory=int(gib * 2**30)) for name, gib in cards]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(cards))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=0: properties[int(device)])


def launched(monkeypatch: pytest.MonkeyPatch, **variables: str) -> None:
    for key, value in variables.items():
        monkeypatch.setenv(key, value)


def torchrun(monkeypatch: pytest.MonkeyPatch, nproc_per_node: int, nnodes: int) -> None:
    """The variables torchrun gives the process of local rank 0 on node 0."""
    world = str(nproc_per_node * nnodes)
    launched(monkeypatch, TORCHELASTIC_RUN_ID="rn50", WORLD_SIZE=world, LOCAL_WORLD_SIZE=str(nproc_per_node),
             RANK="0", LOCAL_RANK="0", GROUP_RANK="0")  # fmt: skip


def srun(monkeypatch: pytest.MonkeyPatch, ntasks_per_node: int, nnodes: int, **more: str) -> None:
    """The variables srun gives task 0 of `srun --nodes=NNODES --ntasks-per-node=NTASKS_PER_NODE`."""
    task = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "rn50", "SLURM_NTASKS": str(ntasks_per_node * nnodes),
            "SLURM_NTASKS_PER_NODE": str(ntasks_per_node), "SLURM_NNODES": str(nnodes), "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # fmt: skip
    launched(monkeypatch, **{**task, **more})


def trainer_layout(cfg: Any) -> tuple[int, int]:
    return int(cfg.trainer.devices), int(cfg.trainer.num_nodes)


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
    """A real process: mode=plan prints the CPU plan and why, then, where this machine cannot run 8 devices, the line
    training stops with (tests/test_plan_checks.py); a training run on 2 cores ends with that one-line error naming
    trainer.devices, after the warning that it would train on the CPU."""
    plan = run_cli("train.py", "mode=plan", *HEADLINE, f"hydra.run.dir={tmp_path / 'plan'}")
    have = torch.cuda.device_count() if torch.cuda.is_available() else os.cpu_count() or 1
    if have < 8:
        assert_one_line_error(plan, "trainer.devices=8", "GPU(s)" if torch.cuda.is_available() else "cores")
    else:
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


def test_torchrun_with_fewer_processes_than_gpus_runs_one_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun --standalone --nproc_per_node=4 on an 8-GPU node: 4 devices (was 8: Lightning's ValueError)."""
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    torchrun(monkeypatch, nproc_per_node=4, nnodes=1)
    cfg = compose_config(["model=resnet50", "precision=amp"])
    reason = resolve_auto_hardware(cfg)
    assert reason == (
        "hardware=auto chose dgxa100: 4x NVIDIA H200 (139 GiB) of 8 visible per node x 1 node from torchrun "
        "(LOCAL_WORLD_SIZE=4, WORLD_SIZE=4), the largest batch table NVIDIA published (A100 80GB)"
    )
    assert trainer_layout(cfg) == (4, 1)
    TorchElasticEnvironment().validate_settings(*trainer_layout(cfg))
    plan = resolve_plan(cfg, check_devices=True)
    assert (plan.world_size, plan.per_device_batch * plan.world_size * plan.accumulation) == (4, plan.global_batch)


def test_torchrun_on_two_nodes_sets_num_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus(monkeypatch, 8, "NVIDIA A100-SXM4-80GB", 80)
    torchrun(monkeypatch, nproc_per_node=8, nnodes=2)
    cfg = compose_config(["model=resnet50", "precision=amp"])
    assert "8x NVIDIA A100-SXM4-80GB (80 GiB) per node x 2 nodes from torchrun" in resolve_auto_hardware(cfg)
    assert trainer_layout(cfg) == (8, 2)
    TorchElasticEnvironment().validate_settings(*trainer_layout(cfg))
    assert resolve_plan(cfg).world_size == 16
    # The command docs/distributed.md shows names the nodes itself: the same value is fine.
    named = compose_config(["model=resnet50", "precision=amp", "trainer.num_nodes=2"])
    resolve_auto_hardware(named)
    assert trainer_layout(named) == (8, 2)


def test_srun_on_two_nodes_with_the_node_gpus_in_every_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """#SBATCH --nodes=2 --ntasks-per-node=8 --gpus-per-node=8: every task sees its node's 8 GPUs."""
    gpus(monkeypatch, 8, "NVIDIA H100 80GB HBM3", 79.2)
    srun(monkeypatch, ntasks_per_node=8, nnodes=2, CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7")
    cfg = compose_config(["model=resnet50", "precision=amp"])
    assert (
        "8x NVIDIA H100 80GB HBM3 (79 GiB) per node x 2 nodes from srun (SLURM_NTASKS_PER_NODE=8, SLURM_NNODES=2)"
        in (resolve_auto_hardware(cfg) or "")
    )
    assert trainer_layout(cfg) == (8, 2)
    SLURMEnvironment(auto_requeue=False).validate_settings(*trainer_layout(cfg))
    assert resolve_plan(cfg, check_devices=True).world_size == 16


def test_srun_with_fewer_tasks_than_gpus_runs_one_device_per_task(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A single-task job on an 8-GPU node: SLURM's world is 1 task, so 1 device (8 was a plan for 8 ranks)."""
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    srun(monkeypatch, ntasks_per_node=1, nnodes=1)
    cfg = compose_config([])
    with caplog.at_level(logging.INFO, logger="imgcls.config.hardware"):
        reason = resolve_auto_hardware(cfg) or ""
    assert "1x NVIDIA H200 (139 GiB) of 8 visible per node x 1 node from srun" in reason
    assert trainer_layout(cfg) == (1, 1) and resolve_plan(cfg).world_size == 1
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning == (
        "hardware=auto: srun started 1 task(s) on this node (SLURM_NTASKS_PER_NODE=1, SLURM_NNODES=1), which gives "
        "them 8 GPUs: 7 stay idle (one task per GPU: srun --ntasks-per-node=8)"
    )


def test_srun_binding_one_gpu_per_task_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """srun --ntasks-per-node=8 --gpus-per-task=1: each task sees only its own GPU. Lightning cannot run that
    (test_lightning_cannot_run_one_bound_gpu_per_task), so auto says how to launch instead of Lightning's error."""
    gpus(monkeypatch, 1, "NVIDIA H200", 139)
    srun(monkeypatch, ntasks_per_node=8, nnodes=1, CUDA_VISIBLE_DEVICES="0", SLURM_GPUS_PER_TASK="1")
    with pytest.raises(SystemExit) as exit_info:
        cli.guarded(run, compose_config([], run_dir=tmp_path / "run"))
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [
        "imgcls: error: srun started 8 tasks on this node (SLURM_NTASKS_PER_NODE=8, SLURM_NNODES=1) but each sees "
        "1 GPU(s) (CUDA_VISIBLE_DEVICES=0, SLURM_GPUS_PER_TASK=1); Lightning puts local rank i on GPU i of the GPUs "
        "its task sees, so every task must see all of the node's GPUs (Lightning-AI/pytorch-lightning#16828): srun "
        "--ntasks-per-node=N --gpus-per-node=N, without --gpus-per-task or --gpu-bind"
    ]


def test_lightning_cannot_run_one_bound_gpu_per_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why auto refuses that binding rather than set trainer.devices: with one visible GPU, devices=8 (what
    SLURMEnvironment wants) fails Lightning's device check, and devices=1 fails SLURMEnvironment's (local rank 3
    would have no device either). When this fails, Lightning runs it: drop the refusal in hardware._fit_launch."""
    import lightning as L
    import lightning.fabric.accelerators.cuda as fabric_cuda
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.accelerators import CUDAAccelerator

    gpus(monkeypatch, 1, "NVIDIA H200", 139)
    monkeypatch.setattr(fabric_cuda, "num_cuda_devices", lambda: 1)
    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: True))
    srun(monkeypatch, ntasks_per_node=8, nnodes=1, SLURM_PROCID="3", SLURM_LOCALID="3")

    def trainer(devices: int) -> L.Trainer:
        plugins = [SLURMEnvironment(auto_requeue=False)]
        return L.Trainer(accelerator="gpu", devices=devices, strategy="ddp", logger=False, plugins=plugins)

    with pytest.raises(MisconfigurationException, match=r"requested gpu: \[0, 1, 2, 3, 4, 5, 6, 7\]"):
        trainer(8)
    one = trainer(1)
    assert one.strategy.launcher is not None
    with pytest.raises(ValueError, match="ntasks-per-node=8"):
        one.strategy.launcher.launch(lambda: None)  # the first thing fit does under DDP


def test_a_plain_process_and_an_interactive_slurm_shell_take_every_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """No launcher: Lightning starts one process per device itself (an interactive SLURM shell is no launch, as
    Lightning tells them apart)."""
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    cfg = compose_config([])
    assert resolve_auto_hardware(cfg) == (
        "hardware=auto chose dgxa100: 8x NVIDIA H200 (139 GiB), the largest batch table NVIDIA published (A100 80GB)"
    )
    assert trainer_layout(cfg) == (8, 1)
    launched(monkeypatch, SLURM_JOB_NAME="interactive", SLURM_NTASKS="1", SLURM_NNODES="1")
    shell = compose_config(["trainer.num_nodes=2"])  # planning a 2-node run from a login shell
    resolve_auto_hardware(shell)
    assert trainer_layout(shell) == (8, 2)


def test_mixed_gpus_get_the_smallest_cards_profile_and_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """GPU 0 alone chose the A100's table: batches that overflow the V100s' 16 GB."""
    mixed_gpus(monkeypatch, [("NVIDIA A100-SXM4-80GB", 80)] * 4 + [("Tesla V100-SXM2-16GB", 15.8)] * 4)
    cfg = compose_config(["model=resnet50", "precision=amp"])
    with caplog.at_level(logging.INFO, logger="imgcls.config.hardware"):
        reason = resolve_auto_hardware(cfg)
    assert reason == (
        "hardware=auto chose dgx1v: 4x NVIDIA A100-SXM4-80GB (80 GiB) + 4x Tesla V100-SXM2-16GB (16 GiB), NVIDIA's "
        "batch table for V100 16GB (DGX-1)"
    )
    assert OmegaConf.to_container(cfg.hardware.batch) == OmegaConf.to_container(
        compose_config(["hardware=dgx1v"]).hardware.batch
    )
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning == (
        "hardware=auto: this node's GPUs differ (4x NVIDIA A100-SXM4-80GB (80 GiB) + 4x Tesla V100-SXM2-16GB "
        "(16 GiB)); every rank plans with dgx1v, the profile of the smallest (Tesla V100-SXM2-16GB), so the larger "
        "cards run below their batch table"
    )
    # Only the GPUs the run uses count: torchrun's 4 processes use GPUs 0-3, the A100s.
    caplog.clear()
    torchrun(monkeypatch, nproc_per_node=4, nnodes=1)
    four = compose_config(["model=resnet50", "precision=amp"])
    with caplog.at_level(logging.INFO, logger="imgcls.config.hardware"):
        resolve_auto_hardware(four)
    assert four.hardware.name == "dgxa100" and not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_torchrun_on_the_cpu_takes_the_launchers_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    no_gpu(monkeypatch)
    torchrun(monkeypatch, nproc_per_node=2, nnodes=1)
    cfg = compose_config([])
    assert resolve_auto_hardware(cfg) == (
        "hardware=auto chose cpu: no CUDA GPU visible; 2 process(es) per node x 1 node from torchrun "
        "(LOCAL_WORLD_SIZE=2, WORLD_SIZE=2)"
    )
    assert (cfg.trainer.accelerator, *trainer_layout(cfg)) == ("cpu", 2, 1)
    TorchElasticEnvironment().validate_settings(*trainer_layout(cfg))


@pytest.mark.parametrize(
    "launch,overrides,message",
    [
        (dict(TORCHELASTIC_RUN_ID="x", WORLD_SIZE="8", LOCAL_WORLD_SIZE="8"), ["trainer.devices=2"],
         "trainer.devices=2 but torchrun started 8 processes on each node (LOCAL_WORLD_SIZE=8, WORLD_SIZE=8); "
         "leave it unset (hardware=auto takes the launcher's) or set 8"),
        (dict(TORCHELASTIC_RUN_ID="x", WORLD_SIZE="16", LOCAL_WORLD_SIZE="8"), ["trainer.num_nodes=4"],
         "trainer.num_nodes=4 but torchrun started 2 node(s) (LOCAL_WORLD_SIZE=8, WORLD_SIZE=16); "
         "leave it unset (hardware=auto takes the launcher's) or set 2"),
        (dict(TORCHELASTIC_RUN_ID="x", WORLD_SIZE="16", LOCAL_WORLD_SIZE="16"), [],
         "torchrun started 16 processes on this node (LOCAL_WORLD_SIZE=16, WORLD_SIZE=16) but it has 8 GPU(s); "
         "Lightning puts local rank i on GPU i: --nproc_per_node=8 at most"),
        (dict(TORCHELASTIC_RUN_ID="x", WORLD_SIZE="12", LOCAL_WORLD_SIZE="8"), [],
         "torchrun's WORLD_SIZE=12 is no multiple of LOCAL_WORLD_SIZE=8: Lightning runs the same number of "
         "processes on every node; give every node the same --nproc_per_node"),
        (dict(SLURM_NTASKS="16", SLURM_JOB_NAME="rn50"), [],
         "srun started SLURM_NTASKS=16 tasks without --ntasks-per-node, which Lightning's SLURM environment "
         "needs: one task per GPU, srun --ntasks-per-node=N with N the GPUs of a node"),
    ],
)  # fmt: skip
def test_a_launch_auto_cannot_fit_is_one_line(
    monkeypatch: pytest.MonkeyPatch, launch: dict[str, str], overrides: list[str], message: str
) -> None:
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    launched(monkeypatch, **launch)
    with pytest.raises(ConfigError) as error:
        resolve_auto_hardware(compose_config(overrides))
    assert str(error.value) == message


def test_a_sweep_under_a_one_process_torchrun_starts_no_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's DDP refusal counts the launcher's processes, not the node's GPUs."""
    gpus(monkeypatch, 8, "NVIDIA H200", 139)
    torchrun(monkeypatch, nproc_per_node=1, nnodes=1)
    monkeypatch.setattr(cli, "_in_multirun", lambda: True)
    monkeypatch.setattr(cli.HydraConfig, "get", staticmethod(lambda: SimpleNamespace(launcher={})))
    cfg = compose_config([])
    cli.refuse_in_process_ddp_sweep(cfg)
    assert trainer_layout(cfg) == (1, 1)
