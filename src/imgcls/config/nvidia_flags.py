"""NVIDIA's `main.py` flags (PyTorch ConvNets, DeepLearningExamples 729963dd) whose imgcls override is not their
own name: what `python train.py --amp` is answered with (cli.refuse_flags). docs/nvidia-options.md is the whole
table; tests/test_nvidia_flags.py checks these rows against it."""

from __future__ import annotations

# flag (dashes as underscores) -> the imgcls key its value goes to, or the whole override of a switch
NVIDIA_FLAGS: dict[str, str] = {
    "a": "model",
    "arch": "model",
    "image_size": "model.image_size",
    "last_bn_0_init": "model.zero_init_last_bn=true",
    "data_backend": "data.backend",
    "j": "data.num_workers",
    "workers": "data.num_workers",
    "prefetch": "data.prefetch_factor",
    "interpolation": "recipe.interpolation",
    "lr_schedule": "recipe.schedule",
    "warmup": "recipe.warmup_epochs",
    "mom": "recipe.momentum",
    "wd": "recipe.weight_decay",
    "use_ema": "recipe.ema_decay",
    "b": "data.batch_size",
    "batch_size": "data.batch_size",
    "optimizer_batch_size": "recipe.global_batch_size",
    "amp": "precision=amp",
    "static_loss_scale": "precision.loss_scale.init_scale",
    "nesterov": "recipe.nesterov=true",
    "bn_weight_decay": "recipe.weight_decay_on=all",
    "jit": "compile=true",
    "devices": "trainer.devices",
    "gpus": "trainer.devices",
}

# NVIDIA's names for the values that imgcls spells otherwise (--data-backend pytorch|dali-cpu|dali-gpu)
NVIDIA_VALUES: dict[str, dict[str, str]] = {
    "data.backend": {"pytorch": "torchvision", "dali-cpu": "dali_cpu", "dali-gpu": "dali_gpu"},
}


def nvidia_override(flag: str, value: str) -> str | None:
    """The override for NVIDIA's `--flag value` (flag without dashes, `-` as `_`), or None for another flag."""
    target = NVIDIA_FLAGS.get(flag)
    if target is None or "=" in target:
        return target
    if target == "model":
        value = value.replace("-", "_")  # --arch resnext101-32x4d
    return f"{target}={NVIDIA_VALUES.get(target, {}).get(value, value)}"
