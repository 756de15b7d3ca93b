"""Which hardware profile (conf/hardware) a run uses: one home for the GPU -> profile rule and for `hardware=auto`.

`hardware=auto`, the default, exists because a default of `cpu` trained the headline command
(`python train.py model=resnext101_32x4d precision=amp trainer.devices=8`) on the CPU of an 8-GPU server without a
word. auto cannot be a plain YAML choice: which profile fits depends on the machine, so it is resolved when a
command starts, before anything reads the values (train, the training benchmark, mode=plan and the CLI's checks).

The chosen profile's values come from its own YAML file through Hydra composition, never from a copy here: one
home per fact, and a profile's own defaults list holds (dgx1v_32g inherits dgx1v). Replacing the `hardware` node is
enough because trainer.accelerator / trainer.devices and data.backend / data.num_workers / ... interpolate
`${hardware.*}`; a value the user set there themselves is no interpolation and stays.

Under a launcher that starts every process itself (torchrun, srun) the launcher, not the GPU count, fixes how many
processes a node runs and how many nodes there are, and Lightning's TorchElasticEnvironment / SLURMEnvironment
refuse a trainer.devices / trainer.num_nodes that disagrees (with a ValueError): auto takes both from the launcher.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from imgcls.config.compose import compose_config, options
from imgcls.errors import ConfigError
from imgcls.typed_config import merge, to_dict

# SLURM job names of an interactive shell (the names lightning.fabric's _is_slurm_interactive_mode checks): there
# srun does not launch the ranks (run/rundir.py keeps a timestamped run dir for the same reason).
INTERACTIVE_JOBS = ("bash", "interactive")

log = logging.getLogger(__name__)

AUTO = "auto"
# Why a GPU gets its profile, for the reason line: the batch table is the only GPU-specific fact a profile holds.
_TABLE_OF = {
    "dgx1v": "NVIDIA's batch table for V100 16GB (DGX-1)",
    "dgx1v_32g": "NVIDIA's batch table for V100 32GB (DGX-1)",
    "t4": "NVIDIA's batch table for T4 16GB",
}


def refuse_auto_on_a_cluster_launcher(cfg: DictConfig, choices: list[str]) -> None:
    """A sweep through a launcher that sizes cluster jobs (hydra/launcher=slurm) with hardware=auto in any job: the
    launcher reads trainer.devices and hardware.num_workers on the submitting node, before any job starts, where
    auto is still cpu's values, so its jobs would ask SLURM for one task and one GPU. `cfg`: the first job's
    config; `choices`: every hardware value of the command line (a sweep's too). One line naming the profiles."""
    if "SlurmLauncher" not in str(cfg.hydra.launcher.get("_target_", "")):
        return
    if AUTO not in choices and (choices or cfg.hardware.get("name") != AUTO):
        return
    profiles = "|".join(p for p in options("hardware") if p not in (AUTO, "cpu"))
    raise ConfigError(
        "hardware=auto with hydra/launcher=slurm: the launcher sizes each SLURM job here, before auto can see the "
        f"compute nodes' GPUs (each job would ask for 1 task and 1 GPU); name their profile: hardware={profiles}"
    )


def hardware_for(gpu_name: str, memory_gib: float) -> str:
    """The hardware profile (conf/hardware) whose batch table fits this GPU."""
    name = gpu_name.upper()
    if "V100" in name:
        return "dgx1v_32g" if memory_gib > 20 else "dgx1v"
    if "T4" in name:
        return "t4"
    return "dgxa100"  # A100, H100 and newer: the largest table NVIDIA published


def runs_on_cuda(accelerator: str) -> bool:
    """Whether a run with this trainer.accelerator trains on a CUDA GPU (auto: when this machine has one)."""
    if accelerator in ("gpu", "cuda"):
        return True
    if accelerator != "auto":
        return False
    import torch  # here: the config commands check a config without importing torch

    return torch.cuda.is_available()


def precision_runs_as(precision: Any, accelerator: str) -> str:
    """The Lightning precision a run trains in: precision.lightning, except AMP (fp16) without CUDA, which runs as
    bf16-mixed (fp16 on a CPU is slow, and not what `precision=amp` on a laptop asks for) unless
    precision.cpu_fp16 asks for fp16 there. One home for training (training/precision.py) and mode=plan."""
    name = str(precision.lightning)
    if name == "16-mixed" and not precision.get("cpu_fp16") and not runs_on_cuda(accelerator):
        return "bf16-mixed"
    return name


def _why(profile: str, gpu_name: str) -> str:
    if profile != "dgxa100":
        return _TABLE_OF[profile]
    if "A100" in gpu_name.upper():
        return "NVIDIA's batch table for A100 80GB (DGX A100)"
    return "the largest batch table NVIDIA published (A100 80GB)"


def _changes(node: Mapping[str, Any], pristine: Mapping[str, Any]) -> dict[str, Any]:
    """The leaves of `node` that differ from `pristine`: what the command line, an experiment or a sweep set on
    top of hardware=auto (hardware.num_workers=16), which must survive the profile's replacement."""
    changed: dict[str, Any] = {}
    for key, value in node.items():
        before = pristine.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            if inner := _changes(value, before):
                changed[key] = inner
        elif key not in pristine or value != before:
            changed[key] = value
    return changed


def _profile(name: str) -> dict[str, Any]:
    """conf/hardware/NAME.yaml as a run with hardware=NAME composes it (its defaults list and conf/local included)."""
    return to_dict(compose_config("train", [f"hardware={name}"]).hardware)


def _follows_profile(node: DictConfig, key: str) -> bool:
    """Whether node.key is still the default interpolation of the hardware profile (not a value the user set)."""
    if not OmegaConf.is_interpolation(node, key):
        return False
    child = node._get_node(key)  # present: an interpolation is a node's value
    return child is not None and str(child._value()).startswith("${hardware.")


class _Gpu(Protocol):
    """What auto reads of torch.cuda.get_device_properties."""

    name: str
    total_memory: int


@dataclass(frozen=True)
class Launch:
    """The layout a launcher that starts every process itself gave this run: what Lightning's cluster environment
    checks trainer.devices (`per_node`) and trainer.num_nodes (`nodes`) against."""

    launcher: str  # torchrun | srun
    per_node: int
    nodes: int
    source: str  # the variables it came from, for the reason and error lines


def launch_of(env: Mapping[str, str]) -> Launch | None:
    """torchrun's or srun's layout, by the rules Lightning picks its cluster environment with (torchelastic first,
    as it may run inside a SLURM allocation; srun unless the job is an interactive shell); None for a process
    that no such launcher started (Lightning starts the other ranks itself, one per visible GPU)."""
    if "TORCHELASTIC_RUN_ID" in env:  # torch.distributed.is_torchelastic_launched()
        world = int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_WORLD_SIZE") or world)
        source = f"LOCAL_WORLD_SIZE={local}, WORLD_SIZE={world}"
        if world % local:
            raise ConfigError(
                f"torchrun's WORLD_SIZE={world} is no multiple of LOCAL_WORLD_SIZE={local}: Lightning runs the same "
                "number of processes on every node; give every node the same --nproc_per_node"
            )
        return Launch("torchrun", local, world // local, source)
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in INTERACTIVE_JOBS:
        return None
    tasks = int(env["SLURM_NTASKS"])
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    if per_node is None and tasks > 1:
        # Lightning's SLURMEnvironment refuses this too, with a RuntimeError when the Trainer is built.
        raise ConfigError(
            f"srun started SLURM_NTASKS={tasks} tasks without --ntasks-per-node, which Lightning's SLURM "
            "environment needs: one task per GPU, srun --ntasks-per-node=N with N the GPUs of a node"
        )
    count = int(per_node or 1)
    nodes = int(env.get("SLURM_NNODES") or max(1, tasks // count))  # SLURM_NNODES: what Lightning checks against
    names = ("SLURM_NTASKS_PER_NODE", "SLURM_NNODES") if per_node else ("SLURM_NTASKS", "SLURM_NNODES")
    return Launch("srun", count, nodes, ", ".join(f"{k}={env[k]}" for k in names if k in env))


def _is_list(devices: Any) -> bool:
    return OmegaConf.is_list(devices) or isinstance(devices, Sequence) and not isinstance(devices, str)


def _device_count(devices: Any) -> int | None:
    """How many devices a trainer.devices value asks for; None for auto/-1 (Lightning's choice)."""
    if isinstance(devices, int) and devices >= 0:
        return devices
    if isinstance(devices, str) and devices.isdigit():
        return int(devices)
    return len(devices) if _is_list(devices) else None


def _used_gpus(devices: Any, visible: int) -> list[int]:
    """The indices of the GPUs a run with this trainer.devices trains on: Lightning gives rank i GPU i of those
    listed, or of 0..N-1."""
    if _is_list(devices):
        return [int(i) for i in devices if 0 <= int(i) < visible] or [0]
    count = _device_count(devices)
    return list(range(visible if count is None else max(1, min(count, visible))))


def _fit_launch(cfg: DictConfig, launch: Launch, visible: int | None, devices: Any) -> None:
    """One line where the launcher's layout cannot run: more processes on a node than GPUs each process sees
    (`visible`; None on the CPU), or a trainer.devices / trainer.num_nodes set to other than the launcher's;
    trainer.num_nodes left at 1 becomes the launcher's node count."""
    if visible is not None and launch.per_node > visible:
        if launch.launcher == "torchrun":
            raise ConfigError(
                f"torchrun started {launch.per_node} processes on this node ({launch.source}) but it has {visible} "
                f"GPU(s); Lightning puts local rank i on GPU i: --nproc_per_node={visible} at most"
            )
        binding = ", ".join(
            f"{k}={os.environ[k]}" for k in ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_PER_TASK") if k in os.environ
        )
        raise ConfigError(
            f"srun started {launch.per_node} tasks on this node ({launch.source}) but each sees {visible} "
            f"GPU(s){f' ({binding})' if binding else ''}; Lightning puts local rank i "
            "on GPU i of the GPUs its task sees, so every task must see all of the node's GPUs "
            "(Lightning-AI/pytorch-lightning#16828): srun --ntasks-per-node=N --gpus-per-node=N, without "
            "--gpus-per-task or --gpu-bind"
        )
    count = _device_count(devices)
    if count is not None and count != launch.per_node:
        raise ConfigError(
            f"trainer.devices={devices} but {launch.launcher} started {launch.per_node} processes on each node "
            f"({launch.source}); leave it unset (hardware=auto takes the launcher's) or set {launch.per_node}"
        )
    if "trainer" not in cfg:
        return
    nodes = int(cfg.trainer.get("num_nodes") or 1)
    if nodes not in (1, launch.nodes):
        raise ConfigError(
            f"trainer.num_nodes={nodes} but {launch.launcher} started {launch.nodes} node(s) ({launch.source}); "
            f"leave it unset (hardware=auto takes the launcher's) or set {launch.nodes}"
        )
    cfg.trainer.num_nodes = launch.nodes  # 1 is also the default, which a multi-node launch must not keep


def _gib(gpu: _Gpu) -> float:
    return gpu.total_memory / 2**30


def _cards(gpus: list[_Gpu]) -> str:
    """`8x NVIDIA H200 (139 GiB)`; a node with several kinds lists each: `4x A (80 GiB) + 4x B (16 GiB)`."""
    kinds: dict[tuple[str, int], int] = {}
    for gpu in gpus:
        kind = (gpu.name, round(_gib(gpu)))
        kinds[kind] = kinds.get(kind, 0) + 1
    return " + ".join(f"{count}x {name} ({gib} GiB)" for (name, gib), count in kinds.items())


def _layout(launch: Launch | None, used: int, visible: int | None) -> str:
    """For the reason line: the GPUs left out, and the processes a launcher laid out."""
    of = f" of {visible} visible" if visible is not None and used < visible else ""
    if launch is None:
        return of
    nodes = f"{launch.nodes} node{'s' if launch.nodes > 1 else ''}"
    return f"{of} per node x {nodes} from {launch.launcher} ({launch.source})"


def resolve_auto_hardware(cfg: DictConfig) -> str | None:
    """Replace hardware=auto in cfg by the profile that fits this machine, in place; return why (also logged).

    A config that names its profile (an experiment's, hardware=dgx1v, or one resolved before) is left alone: a
    second call returns the first call's reason and changes nothing. None: the config named its profile.
    With CUDA: the profile of the smallest of the GPUs the run uses (hardware_for; a node with mixed GPUs is
    warned about in one line, naming them) on every visible GPU, unless trainer.devices was set; without CUDA:
    cpu, with a warning (a run that trains on the CPU on a GPU server is the mistake auto exists to stop).
    Under torchrun or srun (launch_of) trainer.devices is the launcher's processes per node and trainer.num_nodes
    its nodes, on the GPU and on the CPU."""
    hardware = cfg.get("hardware")
    if hardware is None:
        return None
    if hardware.get("name") != AUTO:
        reason = hardware.get(AUTO)
        return None if reason is None else str(reason)
    import torch  # here, not at import: imgcls.cli checks a config before it pays for importing torch

    launch = launch_of(os.environ)
    current = to_dict(hardware)
    follows = "trainer" in cfg and _follows_profile(cfg.trainer, "devices")
    # trainer.devices as set by the user (None: there is no trainer node); with `follows`, the profile's instead
    user_devices = cfg.trainer.devices if "trainer" in cfg and not follows else None
    if not torch.cuda.is_available():
        # auto.yaml is cpu.yaml under another name (its defaults list): its values, and the user's changes, stay.
        chosen, reason = {**current, "name": "cpu"}, "hardware=auto chose cpu: no CUDA GPU visible"
        if launch is not None:
            if follows and "devices" not in _changes(current, _profile(AUTO)):
                chosen["devices"] = launch.per_node
            _fit_launch(cfg, launch, None, chosen["devices"] if follows else user_devices)
            reason += f"; {launch.per_node} process(es){_layout(launch, launch.per_node, None)}"
        log.warning(
            "%s, so this run trains on the CPU (hardware=cpu chooses that without this warning; a GPU profile, "
            "e.g. hardware=dgxa100, plans for that machine instead)", reason,
        )  # fmt: skip
    else:
        visible = torch.cuda.device_count()
        per_node = visible if launch is None else launch.per_node
        changes = _changes({k: v for k, v in current.items() if k != "name"}, _profile(AUTO))
        wanted = changes.get("devices", per_node) if follows else user_devices
        gpus: list[_Gpu] = [torch.cuda.get_device_properties(i) for i in _used_gpus(wanted, visible)]
        smallest = min(gpus, key=_gib)  # a batch that fits the smallest card fits them all
        name = hardware_for(smallest.name, _gib(smallest))
        chosen = _profile(name)
        if follows:
            chosen["devices"] = per_node  # a profile's count is its DGX's; the node's GPUs (launcher's processes) here
        chosen = to_dict(merge(chosen, changes))
        if launch is not None:
            _fit_launch(cfg, launch, visible, chosen["devices"] if follows else user_devices)
            if launch.launcher == "srun" and launch.per_node < visible:
                # Unlike --nproc_per_node, SLURM's GPUs were allocated to the task: the rest wait, paid for.
                log.warning(
                    "hardware=auto: srun started %d task(s) on this node (%s), which gives them %d GPUs: %d stay "
                    "idle (one task per GPU: srun --ntasks-per-node=%d)", launch.per_node, launch.source, visible,
                    visible - launch.per_node, visible,
                )  # fmt: skip
        cards = _cards(gpus)
        if " + " in cards:
            log.warning(
                "hardware=auto: this node's GPUs differ (%s); every rank plans with %s, the profile of the "
                "smallest (%s), so the larger cards run below their batch table", cards, name, smallest.name,
            )  # fmt: skip
        reason = f"hardware=auto chose {name}: {cards}{_layout(launch, len(gpus), visible)}"
        reason += f", {_why(name, smallest.name)}"
        log.info(reason)
    chosen[AUTO] = reason  # kept in the run's config.yaml; mode=plan prints it after an earlier call resolved auto
    cfg.hardware = chosen
    return reason
