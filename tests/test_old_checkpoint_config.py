"""A checkpoint's stored config, as the code before config/schema.py wrote it (tests/data/checkpoint_hparams.json:
the hyper_parameters of a real `python train.py debug=tiny data=synthetic model.arch=test_resnet` checkpoint of
that code), still loads: the module built from it for a resume (the keys it lacks get config/schema.py's
defaults), and the file read for evaluation, export and classify (inference/trained.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from imgcls.config import schema
from imgcls.inference.trained import load_trained
from imgcls.training.module import ClassificationModule

STORED = Path(__file__).resolve().parent / "data" / "checkpoint_hparams.json"


def _stored() -> dict:
    return json.loads(STORED.read_text())


def test_the_stored_config_lacks_keys_the_schema_has() -> None:
    """What makes the fixture an old one: model and recipe keys the schema added since are absent from it."""
    hparams = _stored()
    assert {"se_width", "wide_se"} - set(hparams["model"]) == {"se_width", "wide_se"}
    assert "qat" not in hparams["recipe"]


def test_a_module_builds_from_an_old_checkpoints_config() -> None:
    module = ClassificationModule(**_stored())
    for key, default in schema.defaults("model").items():
        assert module.model_cfg[key] == _stored()["model"].get(key, default), key
    for key, default in schema.defaults("recipe").items():
        assert module.recipe[key] == _stored()["recipe"].get(key, default), key
    assert module.net.eval()(torch.zeros(1, 3, 32, 32)).shape == (1, len(_stored()["classes"]))


def save_checkpoint(hparams: dict, path: Path) -> Path:
    """A weights file as an older train.py wrote it, holding these stored hparams (model, recipe, classes)."""
    module = ClassificationModule(**hparams)
    model = hparams["model"]
    torch.save(
        {
            "hyper_parameters": hparams,
            "state_dict": module.state_dict(),
            "imgcls": {"arch": model["arch"], "model": model, "classes": hparams["classes"],
                       "image_size": model["image_size"], "has_ema": False},
        },
        path,
    )  # fmt: skip
    return path


def test_an_old_checkpoint_loads_for_inference(tmp_path: Path) -> None:
    hparams = _stored()
    model = hparams["model"]
    path = save_checkpoint(hparams, tmp_path / "old.ckpt")
    trained = load_trained(path)
    assert trained.arch == model["arch"] and trained.classes == hparams["classes"]
    assert trained.net(torch.zeros(2, 3, 32, 32)).shape == (2, len(hparams["classes"]))
