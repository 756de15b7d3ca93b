"""The recipe arithmetic of a run, in one unit-tested place: devices, batch sizes, accumulation, LR, WD.

Batch semantics (see README "Batch size"):
- ``data.batch_size`` is the per-device batch (what fits in one device's memory);
- ``recipe.global_batch_size`` is the optimizer batch, the one the LR follows;
- accumulation = global / (per-device x devices x nodes), and must be a whole number.

Both batch sizes may be left ``null`` in the config: they then come from the hardware profile's
table of NVIDIA's published per-platform values (``hardware.batch``), looked up by the model's
``batch_profile`` and the precision's memory class.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from imgcls.config.checks import check_config
from imgcls.config.hardware import precision_runs_as, resolve_auto_hardware
from imgcls.config.published import scaled_hours, throughput
from imgcls.data.shards.manifest import open_shard_set
from imgcls.data.transforms import val_resize_size
from imgcls.errors import ConfigError
from imgcls.training.scheduler import recipe_steps, scaled_lr, warmup_steps
from imgcls.typed_config import to_dict

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema, TrainerSchema


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
    """Micro-batches per optimizer step; an error when the batches do not divide. The batches are positive already
    (config/checks.py: data.batch_size, recipe.global_batch_size and the hardware tables' rows); the world size is
    the machine's (trainer.devices=auto)."""
    if world_size <= 0:
        raise ConfigError(f"devices x nodes = {world_size} must be a positive integer")
    per_step = per_device_batch * world_size
    if global_batch % per_step:
        if global_batch % world_size:  # no per-device batch can fix it
            advice = (
                f"no per-device batch divides it over {world_size} devices: use a number of devices x nodes that "
                f"divides {global_batch}, or a recipe.global_batch_size that is a multiple of {world_size}"
            )
        else:
            advice = f"choose a per-device batch that divides {global_batch // world_size}"
        raise ConfigError(
            f"recipe.global_batch_size={global_batch} is not a multiple of data.batch_size x devices x "
            f"nodes = {per_device_batch} x {world_size} = {per_step}; {advice}"
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


def make_plan(
    *,
    per_device_batch: int,
    global_batch: int,
    world_size: int,
    lr_per_256: float,
    weight_decay: float,
    lr: float | None = None,
) -> RunPlan:
    """lr: an absolute peak LR (`recipe.lr`, NVIDIA's --lr) instead of lr_per_256 scaled to the global batch."""
    return RunPlan(
        per_device_batch=per_device_batch,
        global_batch=global_batch,
        world_size=world_size,
        accumulation=accumulation_steps(global_batch, per_device_batch, world_size),
        lr=float(lr) if lr is not None else scaled_lr(lr_per_256, global_batch),
        weight_decay=weight_decay,
    )


def _requested(trainer_cfg: TrainerSchema) -> tuple[Any, str, int]:
    """trainer.devices (a digit string as its int), trainer.accelerator and trainer.num_nodes."""
    devices = trainer_cfg.devices
    if isinstance(devices, str) and devices not in ("auto", "-1"):
        devices = int(devices) if devices.isdigit() else devices
    accelerator = str(trainer_cfg.accelerator)
    if accelerator == "auto":  # evaluate's default: Lightning takes the GPUs where there are any
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    return devices, accelerator, int(getattr(trainer_cfg, "num_nodes", 1))  # evaluate's trainer: no nodes


def _count(devices: Any) -> int:
    """How many processes a node runs for a trainer.devices value (auto: one, unless the GPUs were counted)."""
    if isinstance(devices, (list, tuple)) or hasattr(devices, "__len__") and not isinstance(devices, str):
        return len(devices)
    if devices in ("auto", -1, "-1"):
        return 1
    if isinstance(devices, str) and "," in devices:  # Lightning's GPU indices: "0,1", "0,"
        return len([index for index in devices.split(",") if index.strip()])
    return int(devices)


def machine_refusal(trainer_cfg: TrainerSchema) -> str | None:
    """Why this machine cannot run trainer.accelerator with trainer.devices, as the one line training stops with
    (world_size_of), and mode=plan prints for a plan of this machine; None when it can. The one home of these
    checks: a plan that passed where training then refused was the mistake this function exists to stop."""
    devices, accelerator, _ = _requested(trainer_cfg)
    if accelerator in ("gpu", "cuda"):
        available = torch.cuda.device_count()
        if available == 0:
            return (
                f"trainer.accelerator={accelerator} but this machine has no CUDA GPU; use hardware=cpu "
                "(or trainer.accelerator=cpu)"
            )
        if isinstance(devices, int) and devices > available:
            return f"trainer.devices={devices} but this machine has {available} GPU(s)"
        return None
    count, cores = _count(devices), os.cpu_count() or 1
    if accelerator == "cpu" and count > cores:
        return f"trainer.devices={count} CPU processes but this machine has {cores} cores"
    return None


def world_size_of(trainer_cfg: TrainerSchema, check_devices: bool = True) -> int:
    """devices x nodes; with check_devices, checked against what this machine has (machine_refusal), and
    trainer.devices=auto on GPUs counted as this machine's GPUs."""
    if check_devices and (refusal := machine_refusal(trainer_cfg)) is not None:
        raise ConfigError(refusal)
    devices, accelerator, nodes = _requested(trainer_cfg)
    if check_devices and accelerator in ("gpu", "cuda") and devices in ("auto", -1, "-1"):
        devices = torch.cuda.device_count()
    count = _count(devices)
    if count <= 0:
        raise ConfigError(f"trainer.devices={devices} must be a positive number of devices")
    return count * nodes


def resolve_plan(cfg: DictConfig, check_devices: bool = True) -> RunPlan:
    """Per-device and global batch (config, else the hardware table), accumulation, LR and WD.

    check_devices=False skips comparing trainer.devices with this machine (for planning a GPU run
    on a CPU machine, e.g. in tests)."""
    table = to_dict(cfg.hardware.batch, resolve=True)
    per_device, global_batch, row_wd = lookup_batch(
        table, str(cfg.model.batch_profile), cfg.precision.memory_class, cfg.hardware.name
    )
    per_device = per_device // int(cfg.model.batch_divisor)
    if cfg.recipe.global_batch_size is not None:
        global_batch = int(cfg.recipe.global_batch_size)
    world_size = world_size_of(cfg.trainer, check_devices)
    if cfg.data.batch_size is not None:
        per_device = int(cfg.data.batch_size)
    else:
        per_device = fit_per_device(per_device, global_batch, world_size)
    weight_decay = cfg.recipe.weight_decay
    if weight_decay is None:
        weight_decay = row_wd if row_wd is not None else cfg.model.weight_decay
    return make_plan(
        per_device_batch=per_device,
        global_batch=global_batch,
        world_size=world_size,
        lr_per_256=float(cfg.recipe.lr_per_256),
        weight_decay=float(weight_decay),
        lr=cfg.recipe.lr,
    )


def train_images(data_cfg: DataSchema) -> tuple[int | None, str]:
    """The number of training images and where it came from: `data.train_images` (ImageNet's published
    count), else the files of data.root/train when that folder exists (a listing; no image is opened), or the
    train count of a shard dataset (data.format=webdataset|tfrecord)."""
    if data_cfg.train_images:
        return data_cfg.train_images, "data.train_images"
    if data_cfg.backend == "synthetic":
        return data_cfg.train_samples, "data.train_samples"
    root = None if OmegaConf.is_missing(data_cfg, "root") else data_cfg.root  # `???`: a root the user has not set
    if data_cfg.format != "folder" and root is not None:
        # The manifest's counts (without one: DALI index files or a scan of the shards' headers).
        return open_shard_set(data_cfg).count("train"), f"{data_cfg.format} shards in {root}"
    train = Path(str(root)) / "train" if root is not None else None
    if train is None or not train.is_dir():
        return None, "unknown: set data.train_images=N"
    count = sum(1 for d in os.scandir(train) if d.is_dir() for f in os.scandir(d.path) if f.is_file())
    return count, f"files in {train}"


def describe(cfg: DictConfig, checked: bool = False) -> dict[str, Any]:
    """`mode=plan`: the resolved run for any machine (an 8-GPU plan on a laptop), without opening an image,
    building a network or touching a GPU. hardware=auto plans for this machine's GPUs (torch.cuda's device
    queries only: cheap, and nothing is built on a GPU); a named profile plans for its own machine. checked: the
    caller has checked the config already."""
    auto = resolve_auto_hardware(cfg)
    if not checked:
        check_config(cfg)
    plan = resolve_plan(cfg, check_devices=False)
    recipe = cfg.recipe
    epochs = int(recipe.epochs)
    images, source = train_images(cfg.data)
    summary: dict[str, Any] = {
        "model": str(cfg.model.name), "arch": str(cfg.model.arch), "image_size": int(cfg.model.image_size),
        "val_resize": val_resize_size(cfg.data, int(cfg.data.image_size)),  # shorter side before the centre crop
        "hardware": str(cfg.hardware.name), **({"hardware_auto": auto} if auto else {}),
        "accelerator": str(cfg.trainer.accelerator),  # which device the run trains on: a GPU profile or the CPU
        "precision": str(cfg.precision.name), "precision_runs_as": _runs_as(cfg), "data.backend": str(cfg.data.backend),
        "recipe": str(recipe.name), "epochs": epochs, "optimizer": str(recipe.optimizer),
        "schedule": str(recipe.schedule), "warmup_epochs": float(recipe.warmup_epochs),
        **plan.as_dict(), "train_images": images, "train_images_from": source,
    }  # fmt: skip
    if images:
        # Training drops the remainder (every rank gets the same count) and the last partial batch.
        batches = (images // plan.world_size) // plan.per_device_batch
        total = recipe_steps(batches, plan.accumulation, epochs)
        summary.update(
            steps_per_epoch=total // epochs, total_steps=total, warmup_steps=warmup_steps(total, epochs,
            float(recipe.warmup_epochs)),
        )  # fmt: skip
    expected = cfg.expected
    summary["expected"] = OmegaConf.to_container(expected, resolve=True) if expected else None
    hours_here = _hours_here(cfg, plan)
    if hours_here:
        summary["expected_hours_here"] = hours_here
    return summary


def _runs_as(cfg: DictConfig) -> str:
    """The precision Lightning trains in on the planned accelerator; AMP without CUDA says why it is bf16."""
    accelerator = str(cfg.trainer.accelerator)
    runs_as = precision_runs_as(cfg.precision, accelerator)
    if runs_as != str(cfg.precision.lightning):
        return (
            f"{runs_as} (precision={cfg.precision.name}'s fp16 autocast needs CUDA: trainer.accelerator={accelerator} "
            "runs bf16 autocast instead, or fp16 with precision.cpu_fp16=true)"
        )
    return runs_as


def plans_this_machine(cfg: DictConfig) -> bool:
    """Whether a plan is of the machine it runs on: hardware=auto chose the profile here, or the run trains on the
    CPU. A GPU profile named by the user or an experiment plans for that profile's machine (an 8-GPU plan on a
    laptop)."""
    return resolve_auto_hardware(cfg) is not None or str(cfg.trainer.accelerator) == "cpu"


def _hours_here(cfg: DictConfig, plan: RunPlan) -> str | None:
    """NVIDIA's training time of a published experiment scaled to the planned model, machine, precision and GPU
    count by NVIDIA's throughput tables; None when the plan is the published run (or it has no time)."""
    expected = cfg.expected or {}  # an experiment's published result, free-form: its keys are optional
    published, hours = expected.get("published_on"), expected.get("hours")
    if not published or hours is None:
        return None
    origin = (str(published.model), str(published.hardware), str(published.precision), int(published.gpus))
    planned = (str(cfg.model.name), str(cfg.hardware.name), str(cfg.precision.name), plan.world_size)
    if planned == origin:
        return None
    scaled = scaled_hours(float(hours), origin, planned)
    if scaled is None:
        missing = planned if throughput(*planned) is None else origin
        return f"no estimate: NVIDIA published no training throughput for {missing[0]} {missing[2]} on {missing[1]}"
    return (
        f"~{scaled:.1f} (an estimate: NVIDIA's {hours} h on {origin[3]}x {origin[1]} {origin[2]}, scaled by its "
        f"published img/s for {planned[3]}x {planned[1]} {planned[2]}, imgcls/config/published_runs.csv)"
    )


def as_written(value: Any) -> str:
    """A value as a user writes it in a config or an override: null, true, 2.048, {top1: 77.12, hours: 3}
    (YAML's flow style on one line), a string bare; not Python's None, True or {'top1': 77.12}."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (dict, list, tuple)):
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=float("inf")).strip()
    return str(value)


def show(cfg: DictConfig) -> dict[str, Any]:
    """Print the plan, one `key  value` line each, and return it; then training's check of the machine. A plan of
    this machine that training would refuse (trainer.devices=8 on a 2-core CPU) ends with training's one line and
    exit code 2 after the plan, so that a dry run fails where the run would; where those devices leave no plan to
    make (the batches do not divide over them), that line alone, which training gives first too. A plan of another
    machine (a named GPU profile) notes what training on this one would refuse, and exits 0."""
    this_machine = plans_this_machine(cfg)
    check_config(cfg)  # training's first check: its line comes before the machine's
    try:
        summary = describe(cfg, checked=True)
    except ConfigError:
        if this_machine:
            world_size_of(cfg.trainer)  # training stops at this machine before the batches: that line, if any
        raise
    width = max(map(len, summary))
    for key, value in summary.items():
        print(f"{key:<{width}}  {as_written(value)}")
    if this_machine:
        sys.stdout.flush()  # the plan first, then the error line (stderr is unbuffered)
        world_size_of(cfg.trainer)  # training's own check of this machine: its one line, exit code 2
    elif (refusal := machine_refusal(cfg.trainer)) is not None:
        print(
            f"imgcls: note: a plan for hardware={cfg.hardware.name}'s machine; training on this one would stop: "
            f"{refusal}",
            file=sys.stderr,
        )
    return summary
