"""The code reads typed settings: a config group's keys as attributes, each with the schema's default where the
config gives none (config/schema.py the one place of a default). A mapping no composition made (a checkpoint's
stored config, a test's dict) is merged onto the schema first (typed_config.settings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from imgcls.config import schema
from imgcls.config.compose import compose_config
from imgcls.config.schema import LoggerSchema, ModelSchema
from imgcls.inference.trained import load_trained
from imgcls.run.loggers import ResumableCSVLogger, build_loggers
from imgcls.run.plan import train_images
from imgcls.typed_config import settings
from tests.test_old_checkpoint_config import save_checkpoint

STORED = Path(__file__).resolve().parent / "data" / "checkpoint_hparams.json"


def test_settings_give_the_schemas_defaults_and_keep_an_older_key() -> None:
    model = settings(ModelSchema, {"arch": "resnet18", "drop_rate": 0, "an_older_key": 1})
    assert model.drop_rate == 0.0 and isinstance(model.drop_rate, float)  # typed as the schema types it
    assert model.drop_path_mask == "sample" and model.se_width is None and model.zero_init_last_bn is False
    assert model.an_older_key == 1  # type: ignore[attr-defined]  # an older imgcls's key loads, unread
    with pytest.raises(AttributeError, match="chanels_last"):
        _ = model.chanels_last  # type: ignore[attr-defined]  # a mistyped name is no silent None


def test_a_checkpoint_without_model_keys_the_schema_has_loads_for_inference(tmp_path: Path) -> None:
    """The model keys a checkpoint lacks get the schema's defaults where a network is built from its file (before,
    inference read drop_path_rate and zero_init_last_bn of the file itself, and such a file did not load)."""
    hparams = json.loads(STORED.read_text())
    for key in ("drop_path_rate", "zero_init_last_bn", "drop_path_mask", "bn_momentum", "bn_eps"):
        del hparams["model"][key]
    path = save_checkpoint(hparams, tmp_path / "older.ckpt")
    trained = load_trained(path)
    assert trained.net(torch.zeros(2, 3, 32, 32)).shape == (2, len(hparams["classes"]))


def test_a_logger_set_to_null_is_off(tmp_path: Path) -> None:
    """A logger key turns its logger on when it is set; null (the schema's default) is off, as for every key of the
    schema. Before, a key present turned it on, and `logger.csv: null` wrote CSV all the same."""
    assert build_loggers(settings(LoggerSchema, {"csv": None}), tmp_path) == []
    csv_only = build_loggers(settings(LoggerSchema, {"csv": {}}), tmp_path)
    assert [type(logger) for logger in csv_only] == [ResumableCSVLogger]


def test_synthetic_data_on_a_folder_option_counts_the_schemas_samples() -> None:
    """data.backend=synthetic on a data option that sets no train_samples: the schema's count, read by the plan
    and the synthetic backend alike (the code types no count of its own)."""
    cfg = compose_config("train", ["data=folder", "data.root=/nonexistent", "data.backend=synthetic", "hardware=cpu"])
    count = schema.defaults("data")["train_samples"]
    assert isinstance(count, int) and cfg.data.train_samples == count
    assert train_images(cfg.data) == (count, "data.train_samples")
