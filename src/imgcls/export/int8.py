"""INT8 post-training quantization: `python -m imgcls.export ckpt=PATH format=int8 [calibration.images=2048]
[calibration.method=percentile] [calibration.batch_size=32] [calibration.seed=0] [data.root=DIR]`.

1. the fp32 ONNX export of imgcls.export (export_onnx, passed in: this module does not import the package
   that calls it);
2. onnxruntime.quantization.quant_pre_process: symbolic shape inference and ORT's graph optimizations, what
   ORT recommends before static quantization;
3. onnxruntime.quantization.quantize_static in QDQ format (QuantizeLinear/DequantizeLinear pairs around each
   quantized op: the explicit-quantization graph TensorRT builds INT8 engines from, and what ORT's CPU provider
   fuses into QLinearConv / QGemm kernels), weights int8 per output channel and symmetric, activations int8
   symmetric (zero point 0, as TensorRT requires), ranges calibrated on `calibration.images` training images
   with the val preprocessing (calibration.py);
4. the "imgcls" metadata of the fp32 export (classes, preprocessing) plus a "quantization" entry saying how
   it was quantized, so classify / evaluate / the benchmark read the INT8 file like the fp32 one.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from imgcls.config.checks import choice, integer, number
from imgcls.config.schema import DataSchema
from imgcls.errors import ConfigError
from imgcls.inference.onnx_model import METADATA_KEY
from imgcls.inference.trained import TrainedModel
from imgcls.quantization.calibration import calibration_batches

METHODS = ("percentile", "minmax", "entropy")
# conf/export.yaml's default, calibration.method=percentile (99.99) with calibration.images=2048, chosen on the
# CIFAR-10 ResNet18 of docs/benchmarks.md (fp32 top-1 65.08 on its 10,000 val images): percentile lost 0.57 and
# 0.82 points with 2048 images (seeds 0, 1) and 0.77 / 1.79 with 512; entropy was best on one pick (-0.25) and
# worst on the other (-2.31, with 512 and 2048 images alike); minmax lost 1.58 (its range follows the largest
# outlier, so the int8 step is coarse for every other value). Percentile is also NVIDIA's calibration for its
# QAT recipes (99.99 percentile histogram, pytorch-quantization); ORT's own default percentile is 99.999.
ACTIVATIONS = ("int8", "uint8")


# The calibration keys, with config.checks' rules (the one place that words what a value must be).
CHECKS = {
    "images": integer(1),
    "batch_size": integer(1),
    "method": choice(*METHODS),
    "percentile": number(50, 100, open_low=True),
    "seed": integer(0),
    "activations": choice(*ACTIVATIONS),
}


def options(cfg: DictConfig) -> dict[str, Any]:
    """The calibration keys, checked before the checkpoint is loaded (a typo costs no model load)."""
    calibration = cfg.get("calibration") or {}
    opts: dict[str, Any] = {key: calibration.get(key) for key in CHECKS}
    for key, check in CHECKS.items():
        allowed = check(opts[key])
        if allowed is not None:
            raise ConfigError(f"calibration.{key}={opts[key]} must be {allowed}")
    return {**opts, "percentile": float(opts["percentile"])}


def _reader(batches: list[np.ndarray], input_name: str) -> Any:
    """onnxruntime's CalibrationDataReader over the calibration batches, with the __len__ / set_range that its
    CalibStridedMinMax option calls: quantize_static then collects one batch per calibrator pass (write_int8)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.position, self.end = 0, len(batches)

        def __len__(self) -> int:
            return len(batches)

        def set_range(self, start_index: int, end_index: int) -> None:
            self.position, self.end = start_index, min(end_index, len(batches))

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self.position >= self.end:
                return None
            self.position += 1
            return {input_name: batches[self.position - 1]}

    return Reader()


def write_int8(
    trained: TrainedModel,
    path: Path,
    data_cfg: DataSchema,
    opts: dict[str, Any],
    write_fp32: Callable[[Path], None],
) -> dict[str, Any]:
    """The INT8 QDQ model at `path`; returns the "quantization" metadata entry written into it."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quant_pre_process, quantize_static

    started = time.perf_counter()
    # Read first (a missing data.root or a bad file is one line before any export work), and held in memory
    # (2048 images at 224 px: 1.2 GB) so that the reader knows its length.
    batches = [
        b.numpy()
        for b in calibration_batches(data_cfg, trained.preprocessing, opts["images"], opts["batch_size"], opts["seed"])
    ]
    with tempfile.TemporaryDirectory(prefix="imgcls-int8-") as tmp:
        fp32, prepared, quantized = Path(tmp) / "fp32.onnx", Path(tmp) / "prepared.onnx", Path(tmp) / "int8.onnx"
        write_fp32(fp32)
        quant_pre_process(str(fp32), str(prepared))
        reader = _reader(batches, onnx.load(str(prepared), load_external_data=False).graph.input[0].name)
        method = {
            "minmax": CalibrationMethod.MinMax,
            "percentile": CalibrationMethod.Percentile,
            "entropy": CalibrationMethod.Entropy,
        }[opts["method"]]
        unsigned = opts["activations"] == "uint8"
        # ORT's calibrators print progress lines to stdout ("Collecting tensor data ..."): export prints one line.
        with contextlib.redirect_stdout(io.StringIO()):
            quantize_static(
                str(prepared),
                str(quantized),
                reader,
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                weight_type=QuantType.QInt8,
                activation_type=QuantType.QUInt8 if unsigned else QuantType.QInt8,
                calibrate_method=method,
                extra_options={
                    "WeightSymmetric": True,
                    "ActivationSymmetric": not unsigned,
                    "CalibPercentile": opts["percentile"],
                    # One batch per calibrator pass: ORT's calibrators otherwise keep every intermediate tensor
                    # of every calibration image until the end (an estimate, not measured: ~0.1 GB per 224 px
                    # ResNet50 image), and its histogram collector cannot stack a smaller last batch with the
                    # others. ORT merges the histograms and min/max ranges across passes.
                    "CalibStridedMinMax": 1,
                },
            )
        note = {
            "format": "onnx-qdq",
            "weights": "int8 symmetric per-channel",
            "activations": "int8 symmetric" if not unsigned else "uint8 asymmetric",
            "method": opts["method"],
            **({"percentile": opts["percentile"]} if opts["method"] == "percentile" else {}),
            "calibration_images": sum(len(b) for b in batches),
            "calibration_seed": opts["seed"],
            "calibration_root": str(data_cfg.root),
            "calibration_preprocessing": "val",
            "tool": _ort_version(),
        }
        model = onnx.load(str(quantized))
        source = {p.key: p.value for p in onnx.load(str(fp32), load_external_data=False).metadata_props}
        fp32_meta = json.loads(source[METADATA_KEY])
        if fp32_meta.get("quantization"):  # the weights of a QAT network (recipe=qat), quantized again here
            note["fine_tuned"] = fp32_meta["quantization"]["method"]
        metadata = {**fp32_meta, "quantization": note}
        del model.metadata_props[:]  # quantize_static keeps some, drops others: the fp32 export's, rewritten
        entry = model.metadata_props.add()
        entry.key, entry.value = METADATA_KEY, json.dumps(metadata)
        onnx.checker.check_model(model)
        onnx.save(model, str(path))
    note["seconds"] = round(time.perf_counter() - started, 1)
    return note


def _ort_version() -> str:
    import onnxruntime

    return f"onnxruntime {onnxruntime.__version__} quantize_static"
