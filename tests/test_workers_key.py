"""The loader workers have one key a user sets, data.num_workers (NVIDIA's -j); hardware.num_workers is the hardware
profile's value for its machine. A run that changes the profile's value still gets those workers, with one line
naming the key to set instead."""

from __future__ import annotations

from pathlib import Path

from imgcls.config.checks import _workers_line
from imgcls.config.compose import compose_config
from tests.conftest import run_cli

LINE = "hardware.num_workers=5 changes hardware=cpu's value (2); set data.num_workers=5"


def test_changing_the_profiles_workers_names_data_num_workers(image_folder: Path) -> None:
    common = ["mode=plan", "hardware=cpu", f"data.root={image_folder}"]
    old = run_cli("train.py", *common, "hardware.num_workers=5")
    assert old.returncode == 0, old.stderr[-2000:]
    said = old.stdout + old.stderr  # Hydra's log handler writes to stdout
    assert [line for line in said.splitlines() if LINE in line] != [], said[-2000:]
    assert said.count("hardware.num_workers=5 changes") == 1  # once, not per check
    new = run_cli("train.py", *common, "data.num_workers=5")
    assert new.returncode == 0 and "changes hardware=" not in new.stdout + new.stderr, new.stderr[-2000:]


def test_a_profile_that_extends_another_names_the_value_it_inherits() -> None:
    """hardware/dgx1v_32g.yaml sets no num_workers of its own (dgx1v's, 8): the line still names that value; the
    file alone (OmegaConf.load) has no num_workers, and the change went unnamed."""
    cfg = compose_config("train", ["hardware=dgx1v_32g", "hardware.num_workers=5"])
    assert _workers_line(cfg.hardware, cfg.data) == (
        "hardware.num_workers=5 changes hardware=dgx1v_32g's value (8); set data.num_workers=5, the one key of the "
        "loader workers (hardware.num_workers is the profile's)"
    )
