"""data.dali_fp16=true: half images from DALI are for autocast runs only.

fp32/tf32 runs fed Half batches into fp32 convolutions and died in a traceback; they are refused in one
line. Under bf16 autocast the first conv casts the fp16 images to bf16 like fp32 ones, so bf16 keeps it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import compose_config, read_report, run_cli, tiny_overrides

pytest.importorskip("nvidia.dali")


def dali_fp16(folder: Path, precision: str, *extra: str) -> list[str]:
    return tiny_overrides(
        folder, "data.backend=dali_cpu", "data.dali_fp16=true", "recipe.epochs=1", "recipe.warmup_epochs=0",
        f"precision={precision}", *extra,
    )  # fmt: skip


@pytest.mark.slow
def test_fp32_run_with_dali_fp16_is_refused_in_one_line(image_folder: Path, tmp_path: Path) -> None:
    result = run_cli("train.py", *dali_fp16(image_folder, "fp32"), f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if "dali_fp16" in ln]
    assert "data.dali_fp16=true" in line and "precision=fp32" in line and "amp or bf16" in line


def test_tf32_refused_too(image_folder: Path) -> None:
    from imgcls.config.checks import check_config
    from imgcls.errors import ConfigError

    with pytest.raises(ConfigError, match="precision=tf32"):
        check_config(compose_config(dali_fp16(image_folder, "tf32")))


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "amp"])
def test_autocast_runs_train_on_half_images(image_folder: Path, tmp_path: Path, precision: str) -> None:
    """amp on a CPU: real fp16 autocast with GradScaler("cpu") (precision.cpu_fp16)."""
    import imgcls.run.train

    extra = ("precision.cpu_fp16=true",) if precision == "amp" else ()
    summary = imgcls.run.train.run(compose_config(dali_fp16(image_folder, precision, *extra), run_dir=tmp_path))
    assert read_report(tmp_path)["epochs"][0]["step"] == 6  # 48 images / batch 8
    assert np.isfinite(summary["train.loss"])
