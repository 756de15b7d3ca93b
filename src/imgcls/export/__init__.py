"""`python -m imgcls.export ckpt=PATH format=weights|onnx|torchscript|int8|triton [use_ema=true] [output=FILE]`.

- weights: a plain state_dict plus metadata (arch, model config, classes, image size, preprocessing), what
  `model.weights=`, `evaluate.py ckpt=` and `imgcls.classify` accept (NVIDIA's checkpoint2model, whose
  --ema was ignored; here use_ema=true exports the EMA weights).
- onnx: torch.onnx.export with a dynamic batch axis; the metadata rides in the model's metadata_props
  (key "imgcls"), so `imgcls.classify backend=onnx` needs nothing else.
- torchscript: torch.jit.trace, metadata in the archive's extra file "imgcls.json".
- int8: INT8 post-training quantization of the onnx export (imgcls.export.int8): a Q/DQ ONNX model
  calibrated on `calibration.images` training images of `data.root=DIR` (required: a file never says where
  data is, inference/trained.py), with the onnx export's metadata plus how it was quantized; runs on ONNX
  Runtime (classify, evaluate.py).
- triton: a Triton Inference Server model repository around the onnx export (imgcls.export.triton:
  `repo=DIR [name=] [max_batch=128] [trt_precision=fp32|fp16] [tensorrt=false]`).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from omegaconf import DictConfig

from imgcls.config.choices import EXPORT_FORMATS
from imgcls.config.compose import compose_train, model_config, required_ckpt
from imgcls.config.schema import DataSchema
from imgcls.errors import ConfigError, DataError
from imgcls.export import int8, triton
from imgcls.inference.onnx_model import METADATA_KEY  # the one reader's key, so writer and reader agree
from imgcls.inference.trained import TrainedModel, load_trained, preprocessing_of
from imgcls.quantization.qat import STATE_KEY as QUANTIZERS_KEY
from imgcls.quantization.qat import without_quantizers
from imgcls.storage import write_atomic
from imgcls.typed_config import merge, to_dict

# The default output's suffix after <stem>[_ema], per format= (config.choices, which the command's check allows);
# triton writes a folder (repo=).
FORMATS = dict(zip(EXPORT_FORMATS, (".pt", ".onnx", ".ts", "_int8.onnx", ""), strict=True))
ONNX_OPSET = 18  # the TorchScript-based exporter's newest well-supported opset; onnxruntime runs it


def default_output(ckpt: str, fmt: str, ema: bool) -> Path:
    path = Path(ckpt).expanduser()
    return path.with_name(f"{path.stem}{'_ema' if ema else ''}{FORMATS[fmt]}")


def run(cfg: DictConfig) -> dict[str, Any]:
    ckpt = required_ckpt(cfg)
    fmt = str(cfg.format)
    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt} is not allowed; use {', '.join(FORMATS)}")
    triton_opts = triton.options(cfg) if fmt == "triton" else None  # before the (slow) checkpoint load
    int8_opts = int8.options(cfg) if fmt == "int8" else None
    model_cfg = model_config(cfg)
    preprocessing = preprocessing_of(compose_train([f"model={cfg.model.name}"]).data) if model_cfg else None
    trained = load_trained(ckpt, bool(cfg.use_ema), model_cfg=model_cfg, preprocessing=preprocessing)
    opset = int(cfg.get("opset") or ONNX_OPSET)
    if triton_opts is not None:
        trained.net = trained.net.float().to(memory_format=torch.contiguous_format).eval()
        return triton.write_repository(trained, triton_opts, lambda path: export_onnx(trained, path, opset))
    if cfg.get("output"):  # the user's choice of path: an existing file there is replaced, as asked
        output = Path(cfg.output).expanduser()
    else:
        output = default_output(ckpt, fmt, trained.ema)
        if os.path.lexists(output):  # a path the user did not name: never replace what may be theirs
            raise ConfigError(f"output={output} (the default beside ckpt) already exists; pass output=PATH")
    if output.is_dir():
        raise ConfigError(f"output={output} is a folder; give the path of the file to write")
    # Exported files are plain NCHW fp32, whatever memory format training used.
    trained.net = trained.net.float().to(memory_format=torch.contiguous_format).eval()
    if fmt == "int8" and trained.quantizers is not None:
        # A QAT network: its fine-tuned weights, in float, quantized by ORT's own static quantization. modelopt
        # places Q/DQ for TensorRT (conv inputs, BN left to fold); ORT's CPU kernels fuse ORT's placement only.
        trained.net = without_quantizers(trained.net)
    quantization: dict[str, Any] = {}
    writers: dict[str, Callable[[TrainedModel, Path], None]] = {
        "weights": export_weights,
        "onnx": lambda t, path: export_onnx(t, path, opset),
        "torchscript": export_torchscript,
    }
    if int8_opts is not None:  # format=int8
        writers["int8"] = lambda t, path: quantization.update(
            int8.write_int8(t, path, calibration_data(cfg, ckpt), int8_opts, lambda p: export_onnx(t, p, opset))
        )
    # The user's file at output= stays whole until the new one is complete (storage.write_atomic).
    write_atomic(output, lambda path: writers[fmt](trained, path))
    summary = {
        "output": str(output),
        "format": fmt,
        "arch": trained.arch,
        "classes": len(trained.classes),
        "weights": "ema" if trained.ema else "raw",
    }
    how = ""
    if quantization:
        summary["quantization"] = quantization
        how = (
            f"; calibrated on {quantization['calibration_images']} images of {quantization['calibration_root']}, "
            f"{quantization['method']}, {quantization['seconds']} s"
        )
    print(
        f"imgcls: wrote {output} ({fmt}, {trained.arch}, {len(trained.classes)} classes, "
        f"{summary['weights']} weights{how})"
    )
    return summary


def calibration_data(cfg: DictConfig, ckpt: str) -> DataSchema:
    """The data config calibration reads: the user's train config (data=folder) with data.root= (required),
    data.num_workers= and data.on_bad_image= of the command line. Never the checkpoint's: its stored root, format
    or cache is the file's author's choice, not the user's (a `pipe:` root runs a shell command)."""
    given = {k: v for k, v in (to_dict(cfg.data) if cfg.get("data") else {}).items() if v is not None}
    if not given.get("root"):
        raise DataError(f"format=int8 needs data.root=DIR (training images to calibrate on) for ckpt={ckpt}")
    train_cfg = compose_train(["data=folder"])
    train_cfg.data.root = str(given["root"])
    # The composed data group, resolved, with the command line's data keys on it: every key of DataSchema (Hydra's
    # pattern: code typed with the schema reads a DictConfig made from it).
    return cast(DataSchema, merge(to_dict(train_cfg.data, resolve=True), given))


def export_weights(trained: TrainedModel, path: Path) -> None:
    blob = {**trained.metadata(), "state_dict": trained.net.state_dict()}
    if trained.quantizers is not None:  # a QAT network: its quantizers' layout, for inference/trained.py to rebuild
        blob[QUANTIZERS_KEY] = trained.quantizers
    torch.save(blob, path)


def _example(trained: TrainedModel, batch: int = 2) -> torch.Tensor:
    size = int(trained.preprocessing["image_size"])
    return torch.randn(batch, 3, size, size)


def export_onnx(trained: TrainedModel, path: Path, opset: int = ONNX_OPSET) -> None:
    import onnx

    with warnings.catch_warnings():
        # dynamo=False: the torch.export-based exporter needs the onnxscript package, which is not a
        # dependency; the TorchScript-based one is deprecated but exports these CNNs exactly.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            trained.net,
            (_example(trained),),
            str(path),
            input_names=["images"],
            output_names=["logits"],
            dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    model = onnx.load(str(path))
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(_metadata(trained))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def export_torchscript(trained: TrainedModel, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace is deprecated in favour of torch.export
        traced = torch.jit.trace(trained.net, _example(trained))
        torch.jit.save(traced, str(path), _extra_files={f"{METADATA_KEY}.json": json.dumps(_metadata(trained))})


def _metadata(trained: TrainedModel) -> dict[str, Any]:
    return {k: v for k, v in trained.metadata().items() if k != "format"}
