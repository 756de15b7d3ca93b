"""Every option of every group extends its group's schema (config/schema.py), and read alone
(imgcls.config.compose.group_option: a checkpoint's precision, recipe/qat's calibration defaults, a hardware
profile's loader workers) it is what composition puts into the group: the file's defaults list (the schema, the
options it extends) merged in. The file by itself (OmegaConf.load) lacks every key those set."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from imgcls.config import schema
from imgcls.config.compose import CONF_DIR, compose_train, group_option, options
from imgcls.run.loggers import build_loggers

EVERY_OPTION = [(group, option) for group in schema.GROUPS if group for option in options(group)]


@pytest.mark.parametrize(("group", "option"), EVERY_OPTION)
def test_an_option_read_alone_is_what_composition_puts_in_its_group(group: str, option: str) -> None:
    composed = compose_train([f"{group}={option}"])[group]
    assert OmegaConf.get_type(composed) is schema.GROUPS[group], f"{group}={option} does not extend its schema"
    assert OmegaConf.to_container(group_option(group, option)) == OmegaConf.to_container(composed)


def test_a_base_an_option_extends_gives_the_keys_the_option_leaves_out() -> None:
    assert OmegaConf.load(CONF_DIR / "hardware" / "dgx1v_32g.yaml").get("devices") is None
    assert group_option("hardware", "dgx1v_32g").devices == 8  # dgx1v's


@pytest.mark.parametrize(
    ("option", "loggers"),
    [("none", []), ("csv", ["ResumableCSVLogger"]), ("wandb", ["ResumableCSVLogger", "WandbLogger"])],
)
def test_a_logger_option_turns_on_the_loggers_it_sets_and_no_other(
    option: str, loggers: list[str], tmp_path: Path
) -> None:
    """Every key of LoggerSchema is in every option, null where the option leaves it: null is off, `{}` on."""
    cfg = compose_train([f"logger={option}"])
    assert [type(logger).__name__ for logger in build_loggers(cfg.logger, tmp_path)] == loggers
