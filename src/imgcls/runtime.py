"""Facts about the processes of a run: world size, device checks, the progress bar."""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

from imgcls.errors import ConfigError


def world_size_of(trainer_cfg: Any, check_devices: bool = True) -> int:
    """devices x nodes, checked against what this machine has."""
    devices = trainer_cfg.devices
    accelerator = str(trainer_cfg.accelerator)
    nodes = int(trainer_cfg.get("num_nodes") or 1)
    if isinstance(devices, str) and devices not in ("auto", "-1"):
        devices = int(devices) if devices.isdigit() else devices
    if accelerator in ("gpu", "cuda") and check_devices:
        available = torch.cuda.device_count()
        if available == 0:
            raise ConfigError(
                f"trainer.accelerator={accelerator} but this machine has no CUDA GPU; use hardware=cpu "
                "(or trainer.accelerator=cpu)"
            )
        if devices in ("auto", -1, "-1"):
            devices = available
        elif isinstance(devices, int) and devices > available:
            raise ConfigError(f"trainer.devices={devices} but this machine has {available} GPU(s)")
    if isinstance(devices, (list, tuple)) or hasattr(devices, "__len__") and not isinstance(devices, str):
        count = len(devices)
    elif devices in ("auto", -1, "-1"):
        count = 1
    else:
        count = int(devices)
    if count <= 0:
        raise ConfigError(f"trainer.devices={devices} must be a positive number of devices")
    cores = os.cpu_count() or 1
    if accelerator == "cpu" and check_devices and count > cores:
        raise ConfigError(f"trainer.devices={count} CPU processes but this machine has {cores} cores")
    return count * nodes


def progress_bar(kind: str | None) -> Any:
    if kind in (None, "none"):
        return None
    if kind == "rich":
        return RichProgressBar(leave=True)
    if kind == "tqdm":
        return TQDMProgressBar()
    raise ConfigError(f"callbacks.progress_bar={kind} is not allowed; use rich, tqdm or none")
