"""NVIDIA's main.py flags typed to train.py: one line with the override to type instead, the same key that
docs/nvidia-options.md gives for that flag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from imgcls.cli import refuse_flags
from imgcls.config.nvidia_flags import NVIDIA_FLAGS, nvidia_override
from imgcls.errors import ConfigError

DOC = Path(__file__).resolve().parent.parent / "docs" / "nvidia-options.md"


@pytest.mark.parametrize(
    ("argv", "override"),
    [
        (["--data-backend", "dali-cpu"], "data.backend=dali_cpu"),
        (["--data-backend", "pytorch"], "data.backend=torchvision"),
        (["--amp"], "precision=amp"),
        (["--workers", "5"], "data.num_workers=5"),
        (["-j", "5"], "data.num_workers=5"),
        (["--lr-schedule", "cosine"], "recipe.schedule=cosine"),
        (["-b", "256"], "data.batch_size=256"),
        (["--devices", "8"], "trainer.devices=8"),
        (["--arch", "resnext101-32x4d"], "model=resnext101_32x4d"),
        (["--static-loss-scale", "128"], "precision.loss_scale.init_scale=128"),
        (["--epochs", "3"], "recipe.epochs=3"),  # its own name: the key whose last part it is
    ],
)
def test_nvidias_flags_are_answered_with_the_override_to_type(argv: list[str], override: str) -> None:
    with pytest.raises(ConfigError) as refused:
        refuse_flags("train", argv)
    assert str(refused.value) == f"{' '.join(argv)}: options are KEY=VALUE overrides, not --flags; use {override}"


def _documented() -> dict[str, str]:
    """docs/nvidia-options.md's rows: each `--flag` / `-f` of the NVIDIA column -> the first `key` of the imgcls one."""
    rows: dict[str, str] = {}
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]  # not at an escaped \|
        if len(cells) < 2 or not cells[0].startswith("`-"):
            continue
        first = re.match(r"`([^`]+)`", cells[1])
        if first is None:
            continue
        for flag in re.findall(r"(?:^|[`/])-{1,2}([a-z][a-z0-9_-]*)", cells[0]):
            rows[flag.replace("-", "_")] = first.group(1)
    return rows


def test_the_flags_table_says_what_the_docs_say() -> None:
    documented = _documented()
    for flag in set(NVIDIA_FLAGS) - {"devices", "gpus"}:  # not main.py's: torchrun's and Lightning's habits
        assert flag in documented, f"--{flag} is not in docs/nvidia-options.md"
        given = nvidia_override(flag, "VALUE")
        assert given is not None
        doc = documented[flag].replace("NAME", "VALUE").split("=")[0]
        assert given.split("=")[0] == doc, (flag, given, documented[flag])
