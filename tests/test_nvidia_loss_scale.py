"""fp16 loss scales as NVIDIA's code set them: `precision.loss_scale=null` is the GradScaler NVIDIA's PyTorch main.py
makes without --static-loss-scale (PYT/main.py:262-267, :477-483 at 729963dd: init 1, x2 every 100 finite steps, x0.5
on an overflow), not Lightning's default (65536, 2000); TF1's SE-ResNeXt101 DGX A100 AMP run, whose script passes no
--static_loss_scale, runs TF AMP's automatic dynamic scale."""

from __future__ import annotations

from imgcls.training.precision import StaticGradScaler, resolve_precision
from tests.conftest import compose_config


def _scaler_settings(*overrides: str) -> tuple[type, float, int, float, float]:
    cfg = compose_config([*overrides, "precision.cpu_fp16=true"])
    precision, plugins = resolve_precision(cfg.precision, "cpu")
    (plugin,) = plugins
    scaler = plugin.scaler
    assert precision is None and plugin.precision == "16-mixed" and scaler.is_enabled()
    return type(scaler), scaler._init_scale, scaler._growth_interval, scaler._growth_factor, scaler._backoff_factor


def test_a_null_loss_scale_is_nvidias_default_scaler() -> None:
    settings = _scaler_settings("precision=amp", "precision.loss_scale=null")
    assert settings[1:] == (1.0, 100, 2.0, 0.5)
    assert settings[0] is not StaticGradScaler


def test_tf1_se_resnext101_dgxa100_amp_scales_dynamically_as_tf_amp() -> None:
    cfg = compose_config(["experiment=tf1_se_resnext101_32x4d_dgxa100_amp_90e", "data.root=/imagenet"])
    assert cfg.precision.loss_scale.dynamic is True
    settings = _scaler_settings("experiment=tf1_se_resnext101_32x4d_dgxa100_amp_90e", "data.root=/imagenet")
    assert settings[1:] == (2.0**15, 2000, 2.0, 0.5)  # TF's DynamicLossScale defaults
    # Its DGX-1 sibling's script passes --static_loss_scale 128: a fixed scale
    fixed = _scaler_settings("experiment=tf1_se_resnext101_32x4d_dgx1v_amp_90e", "data.root=/imagenet")
    assert fixed[:2] == (StaticGradScaler, 128.0)
