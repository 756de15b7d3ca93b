"""The recipe arithmetic of a run, in one pure and unit-tested place.

Batch semantics (see README "Batch size"):
- ``data.batch_size`` is the per-device batch (what fits in one device's memory);
- ``recipe.global_batch_size`` is the optimizer batch, the one the LR follows;
- accumulation = global / (per-device x devices x nodes), and must be a whole number.

Both batch sizes may be left ``null`` in the config: they then come from the hardware profile's
table of NVIDIA's published per-platform values (``hardware.batch``), looked up by the model's
``batch_profile`` and the precision's memory class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from imgcls.errors import ConfigError


@dataclass(frozen=True)
class RunPlan:
    per_device_batch: int
    global_batch: int
    world_size: int
    accumulation: int
    lr: float
    weight_decay: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def lookup_batch(
    table: Mapping[str, Any], profile: str, memory_class: str, hardware: str
) -> tuple[int, int, float | None]:
    """Per-device batch, global batch and optional WD override of a hardware profile's row."""
    row = table.get(profile) or table.get("default")
    if row is None:
        raise ConfigError(
            f"hardware={hardware} has no batch size for model profile '{profile}'; "
            f"set data.batch_size and recipe.global_batch_size (known: {', '.join(sorted(table))})"
        )
    entry = row[memory_class]
    return int(entry["per_device"]), int(entry["global"]), entry.get("weight_decay")


def accumulation_steps(global_batch: int, per_device_batch: int, world_size: int) -> int:
    """Micro-batches per optimizer step; an error when the batches do not divide."""
    if per_device_batch <= 0:
        raise ConfigError(f"data.batch_size={per_device_batch} must be a positive integer")
    if global_batch <= 0:
        raise ConfigError(f"recipe.global_batch_size={global_batch} must be a positive integer")
    if world_size <= 0:
        raise ConfigError(f"devices x nodes = {world_size} must be a positive integer")
    per_step = per_device_batch * world_size
    if global_batch % per_step:
        raise ConfigError(
            f"recipe.global_batch_size={global_batch} is not a multiple of data.batch_size x devices x "
            f"nodes = {per_device_batch} x {world_size} = {per_step}; choose a per-device batch that "
            f"divides {global_batch // world_size if global_batch % world_size == 0 else global_batch}"
        )
    return global_batch // per_step


def fit_per_device(per_device: int, global_batch: int, world_size: int) -> int:
    """The largest per-device batch <= the table's that divides the global batch over the devices.

    Used only when the user did not set data.batch_size: a recipe's global batch (e.g. 4096 for
    EfficientNet) then still works with a hardware row published for another model."""
    if global_batch % world_size:
        return per_device
    per_rank = global_batch // world_size
    return next((d for d in range(min(per_device, per_rank), 0, -1) if per_rank % d == 0), per_device)


def scaled_lr(lr_per_256: float, global_batch: int) -> float:
    """The linear scaling rule NVIDIA uses: 0.256 per 256 images for the ResNets."""
    return lr_per_256 * global_batch / 256


def make_plan(
    *, per_device_batch: int, global_batch: int, world_size: int, lr_per_256: float, weight_decay: float
) -> RunPlan:
    return RunPlan(
        per_device_batch=per_device_batch,
        global_batch=global_batch,
        world_size=world_size,
        accumulation=accumulation_steps(global_batch, per_device_batch, world_size),
        lr=scaled_lr(lr_per_256, global_batch),
        weight_decay=weight_decay,
    )


def warmup_steps(total_steps: int, epochs: int, warmup_epochs: float) -> int:
    """Warmup length in optimizer steps; the schedule is stepped per optimizer step, not per epoch."""
    return min(total_steps, round(warmup_epochs * total_steps / max(1, epochs)))
