"""A checkpoint's stored config outlives the code that wrote it: the hyper-parameters a run of main at 390178c
saved (tests/fixtures/checkpoint_hparams_390178c.json, from `train.py debug=tiny model.arch=test_resnet
recipe.epochs=1`) still build the module, train, and evaluate through the real command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import pytest

from imgcls.data.datamodule import ClassificationDataModule
from imgcls.quantization import qat
from imgcls.training.module import ClassificationModule
from tests.conftest import compose_config, run_cli, tiny_overrides

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_hparams_390178c.json"


def stored_hparams() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def test_a_stored_config_of_390178c_trains_saves_and_evaluates(image_folder: Path, tmp_path: Path) -> None:
    hparams = stored_hparams()
    module = ClassificationModule(**hparams)  # what Lightning's load_from_checkpoint does with them
    data = compose_config(tiny_overrides(image_folder, "data.num_workers=0")).data
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=2, limit_val_batches=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    # configure_optimizers reads the stored recipe's schedule, milestones and LR interval and the plan's WD.
    trainer.fit(module, datamodule=ClassificationDataModule(data, batch_size=8))
    assert trainer.global_step == 2
    assert trainer.optimizers[0].param_groups[-1]["weight_decay"] == hparams["plan"]["weight_decay"]
    ckpt = tmp_path / "old.ckpt"
    trainer.save_checkpoint(ckpt)
    output = tmp_path / "eval.json"
    args = [f"ckpt={ckpt}", f"data.root={image_folder}", "data.num_workers=0", f"output={output}"]
    result = run_cli("evaluate.py", *args)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads(output.read_text())
    assert metrics["model"] == "test_resnet" and 0 <= metrics["val.top1"] <= 100, metrics


def test_a_stored_qat_recipe_without_the_later_keys_takes_conf_recipe_qat_yaml_values() -> None:
    # The first QAT recipes stored only these three: calibrator, percentile, quantizers and the preprocessing came
    # later, and a checkpoint without them ran with the values conf/recipe/qat.yaml holds.
    recipe = {**stored_hparams()["recipe"], "name": "qat", "qat": {"calibration_images": 64, "seed": 3}}
    described = qat.describe({"recipe": recipe})
    assert described["calibration_images"] == 64 and described["calibration_seed"] == 3
    assert (described["calibrator"], described["calibration_preprocessing"]) == ("max", "val")
    assert "conv" in described["quantized"]
    stored = {**recipe, "qat": {**recipe["qat"], "calibrator": "percentile", "percentile": 99.9}}
    assert qat.describe({"recipe": stored})["calibrator"] == "histogram, percentile 99.9"


def test_a_step_schedule_needs_its_milestones_from_the_recipe() -> None:
    import torch

    from imgcls.training.scheduler import build_scheduler

    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="milestones"):
        build_scheduler(optimizer, 100, 0, 0.0, "step", epochs=10)
