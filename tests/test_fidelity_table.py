"""docs/fidelity.md's value-by-value table against the composed configs.

The section "PyTorch recipes and TF1's optimizer, value by value" has one row per (experiment, key) with the value
NVIDIA's code gives (each read at the NVIDIA file:line in the row). Each row's experiment is composed as
`python train.py experiment=E` would (composition only, nothing is trained) and the key is read from the config
(a dotted path) or from the run plan (`plan.<field>`, imgcls.run.plan.resolve_plan), so that a changed recipe, model,
hardware table or plan arithmetic fails here, naming the NVIDIA source it no longer matches.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from imgcls.run.plan import RunPlan, resolve_plan
from tests.conftest import ROOT, compose_config

HEADING = "## PyTorch recipes and TF1's optimizer, value by value"
HEADER = "| experiment | key | NVIDIA | source |"
MISSING = object()

# The published runs the table must cover (at least one row each).
COVERED = (
    "resnet50_dgx1v_amp_90e",
    "resnet50_dgx1v_amp_250e",
    "resnet50_dgxa100_tf32_90e",
    "resnext101_32x4d_dgx1v_amp_90e",
    "se_resnext101_32x4d_dgx1v_amp_90e",
    "efficientnet_b0_dgxa100_amp_400e",
    "efficientnet_b4_dgxa100_amp_400e",
    "tf1_resnet50_dgx1v_amp_90e",
    "tf1_resnet50_dgx1v_amp_250e",
    "tf1_resnext101_32x4d_dgx1v_amp_90e",
    "tf1_se_resnext101_32x4d_dgx1v_amp_90e",
)


def _table_rows() -> list[tuple[str, str, str, str]]:
    """(experiment, key, NVIDIA literal, source) of each row between the table's header and the first blank line."""
    text = (ROOT / "docs" / "fidelity.md").read_text()
    section = text[text.index(HEADING) :]
    lines = section[section.index(HEADER) :].splitlines()
    rows = []
    for line in lines[2:]:  # the header and its |---| line
        if not line.strip():
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"docs/fidelity.md: a row of the value table has {len(cells)} cells: {line}"
        experiment, key, value, source = (cell.strip("`") if i < 3 else cell for i, cell in enumerate(cells))
        rows.append((experiment, key, value, source))
    return rows


ROWS = _table_rows()


def parse_literal(text: str) -> Any:
    """true/false/null, a number, or the word itself."""
    words = {"true": True, "false": False, "null": None}
    if text in words:
        return words[text]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


@functools.cache
def _config(experiment: str) -> DictConfig:
    return compose_config([f"experiment={experiment}"])


@functools.cache
def _plan(experiment: str) -> RunPlan:
    return resolve_plan(_config(experiment), check_devices=False)


def imgcls_value(experiment: str, key: str) -> Any:
    if key.startswith("plan."):
        field = key.removeprefix("plan.")
        plan = _plan(experiment).as_dict()
        assert field in plan, f"{key}: RunPlan has no field {field} (it has {', '.join(plan)})"
        return plan[field]
    value = OmegaConf.select(_config(experiment), key, default=MISSING)
    assert value is not MISSING, f"experiment={experiment} has no key {key}"
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def test_the_table_covers_the_published_pytorch_and_tf1_runs() -> None:
    assert len(ROWS) >= 60, f"docs/fidelity.md value table: {len(ROWS)} rows, expected at least 60"
    experiments = {row[0] for row in ROWS}
    assert not set(COVERED) - experiments, f"no rows for {sorted(set(COVERED) - experiments)}"
    pairs = [(row[0], row[1]) for row in ROWS]
    assert len(pairs) == len(set(pairs)), "an (experiment, key) pair is listed twice"
    assert all(row[3] for row in ROWS), "every row names its NVIDIA source"


@pytest.mark.parametrize(("experiment", "key", "nvidia", "source"), ROWS, ids=[f"{e}-{k}" for e, k, _, _ in ROWS])
def test_imgcls_config_has_nvidias_value(experiment: str, key: str, nvidia: str, source: str) -> None:
    expected = parse_literal(nvidia)
    actual = imgcls_value(experiment, key)
    where = f"experiment={experiment} {key} = {actual!r}, NVIDIA {nvidia} ({source})"
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        assert actual == expected and type(actual) is type(expected), where
    else:
        assert not isinstance(actual, bool) and isinstance(actual, (int, float)), where
        assert actual == pytest.approx(expected, rel=1e-9), where
