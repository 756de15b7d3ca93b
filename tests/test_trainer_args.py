"""`trainer.X=...` for every lightning.Trainer argument (README: "any lightning.Trainer argument"); the ones
imgcls sets from other keys, and names Lightning does not know, are refused in one line."""

from __future__ import annotations

import inspect
from pathlib import Path

import lightning as L
import pytest
from lightning.pytorch.profilers import SimpleProfiler
from lightning.pytorch.strategies import DDPStrategy

from imgcls.errors import ConfigError
from imgcls.run.hook_dispatch import NoProfiler
from imgcls.run.plan import resolve_plan
from imgcls.run.trainer import IMGCLS_TRAINER_ARGS, build_trainer
from tests.conftest import compose_config, tiny_overrides


def trainer_for(folder: Path, *overrides: str) -> L.Trainer:
    cfg = compose_config(tiny_overrides(folder, "data.batch_size=4", *overrides))
    return build_trainer(cfg, resolve_plan(cfg, check_devices=False), callbacks=[], loggers=[])


def test_every_trainer_argument_is_a_config_key() -> None:
    arguments = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
    assert set(compose_config([]).trainer) == arguments - set(IMGCLS_TRAINER_ARGS)


def test_strategy_override_reaches_the_trainer(image_folder: Path) -> None:
    """Was a Hydra struct error ("Could not override 'trainer.strategy'")."""
    default = trainer_for(image_folder, "trainer.devices=2")
    assert type(default.strategy) is DDPStrategy and default.strategy._start_method == "popen"  # imgcls: ddp
    spawn = trainer_for(image_folder, "trainer.devices=2", "trainer.strategy=ddp_spawn")
    assert spawn.strategy._start_method == "spawn"
    assert trainer_for(image_folder, "trainer.detect_anomaly=true")._detect_anomaly


@pytest.mark.parametrize(
    "override,message",
    [
        ("+trainer.precision=16", "trainer.precision is set by imgcls; use precision=amp"),
        ("+trainer.max_epoch=3", "trainer.max_epoch is not a lightning.Trainer argument; allowed: accelerator,"),
    ],
)
def test_trainer_arguments_imgcls_cannot_take(image_folder: Path, override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("|", r"\|")):
        trainer_for(image_folder, override)


def test_a_profiler_the_user_names_is_lightnings_and_none_is_the_null_one(image_folder: Path) -> None:
    """trainer.profiler=null: one reusable null context a hook call (run/hook_dispatch.py); a named one is
    Lightning's, and profiles."""
    assert type(trainer_for(image_folder).profiler) is NoProfiler
    assert type(trainer_for(image_folder, "trainer.profiler=simple").profiler) is SimpleProfiler
