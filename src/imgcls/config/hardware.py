"""Which hardware profile (conf/hardware) a run uses: one home for the GPU -> profile rule and for `hardware=auto`.

`hardware=auto`, the default, exists because a default of `cpu` trained the headline command
(`python train.py model=resnext101_32x4d precision=amp trainer.devices=8`) on the CPU of an 8-GPU server without a
word. auto cannot be a plain YAML choice: which profile fits depends on the machine, so it is resolved when a
command starts, before anything reads the values (train, the training benchmark, mode=plan and the CLI's checks).

The chosen profile's values come from its own YAML file through Hydra composition, never from a copy here: one
home per fact, and a profile's own defaults list holds (dgx1v_32g inherits dgx1v). Replacing the `hardware` node is
enough because trainer.accelerator / trainer.devices and data.backend / data.num_workers / ... interpolate
`${hardware.*}`; a value the user set there themselves is no interpolation and stays.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from imgcls.config.compose import compose_config, options
from imgcls.errors import ConfigError
from imgcls.typed_config import merge, to_dict

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


def resolve_auto_hardware(cfg: DictConfig) -> str | None:
    """Replace hardware=auto in cfg by the profile that fits this machine, in place; return why (also logged).

    A config that names its profile (an experiment's, hardware=dgx1v, or one resolved before) is left alone: a
    second call returns the first call's reason and changes nothing. None: the config named its profile.
    With CUDA: the profile of GPU 0 (hardware_for) on every visible GPU, unless trainer.devices was set; without
    CUDA: cpu, with a warning (a run that trains on the CPU on a GPU server is the mistake auto exists to stop)."""
    hardware = cfg.get("hardware")
    if hardware is None:
        return None
    if hardware.get("name") != AUTO:
        reason = hardware.get(AUTO)
        return None if reason is None else str(reason)
    import torch  # here, not at import: imgcls.cli checks a config before it pays for importing torch

    current = to_dict(hardware)
    if not torch.cuda.is_available():
        # auto.yaml is cpu.yaml under another name (its defaults list): its values, and the user's changes, stay.
        chosen, reason = {**current, "name": "cpu"}, "hardware=auto chose cpu: no CUDA GPU visible"
        log.warning(
            "%s, so this run trains on the CPU (hardware=cpu chooses that without this warning; a GPU profile, "
            "e.g. hardware=dgxa100, plans for that machine instead)", reason,
        )  # fmt: skip
    else:
        gpus = torch.cuda.device_count()
        properties = torch.cuda.get_device_properties(0)
        memory_gib = properties.total_memory / 2**30
        name = hardware_for(properties.name, memory_gib)
        chosen = _profile(name)
        if "trainer" in cfg and _follows_profile(cfg.trainer, "devices"):
            chosen["devices"] = gpus  # a profile's count is its DGX's; this machine's GPUs are what it has
        changes = _changes({k: v for k, v in current.items() if k != "name"}, _profile(AUTO))
        chosen = to_dict(merge(chosen, changes))
        gpu = f"{gpus}x {properties.name} ({memory_gib:.0f} GiB)"
        reason = f"hardware=auto chose {name}: {gpu}, {_why(name, properties.name)}"
        log.info(reason)
    chosen[AUTO] = reason  # kept in the run's config.yaml; mode=plan prints it after an earlier call resolved auto
    cfg.hardware = chosen
    return reason
