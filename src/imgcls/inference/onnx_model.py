"""An imgcls ONNX export (fp32 `format=onnx` or INT8 `format=int8`) on ONNX Runtime's CPU provider, with its
classes and val preprocessing read from the "imgcls" metadata_props entry that imgcls.export writes.

The one loader that `imgcls.classify backend=onnx`, `evaluate.py ckpt=MODEL.onnx` and the inference benchmark
(`evaluate.py mode=benchmark ckpt=MODEL.onnx`) share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from imgcls.errors import CheckpointError
from imgcls.inference.trained import checked_classes, checked_preprocessing
from imgcls.models.weights import not_a_file

METADATA_KEY = "imgcls"  # the metadata_props key imgcls.export writes and this module reads


def is_onnx_path(path: str | Path) -> bool:
    return str(path).lower().endswith(".onnx")


@dataclass
class OnnxModel:
    """logits (numpy, float32) = model(images NCHW float32), on an onnxruntime InferenceSession."""

    session: Any  # onnxruntime.InferenceSession
    path: str
    metadata: dict[str, Any]
    input_name: str = field(init=False)

    def __post_init__(self) -> None:
        self.input_name = self.session.get_inputs()[0].name

    @property
    def classes(self) -> list[str]:
        return list(self.metadata["classes"])

    @property
    def preprocessing(self) -> dict[str, Any]:
        return dict(self.metadata["preprocessing"])

    @property
    def arch(self) -> str:
        return str(self.metadata.get("arch", "?"))

    @property
    def image_size(self) -> int:
        return int(self.metadata.get("image_size") or self.preprocessing["image_size"])

    @property
    def quantization(self) -> dict[str, Any] | None:
        """How an INT8 export was quantized (imgcls.export.int8), None for an fp32 export."""
        return self.metadata.get("quantization")

    @property
    def precision(self) -> str:
        return "int8" if self.quantization else "fp32"

    def run(self, images: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: images})[0]

    def __call__(self, images: torch.Tensor | np.ndarray) -> np.ndarray:
        array = images.numpy() if isinstance(images, torch.Tensor) else images
        # ORT takes float32 C-contiguous input only (a channels_last tensor's numpy view is not).
        return self.run(np.ascontiguousarray(array, dtype=np.float32))


def session_options(threads: int | None = None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        # ORT's default is one intra-op thread per physical core; set to match torch's threads in a benchmark.
        options.intra_op_num_threads = int(threads)
    return options


def load_onnx(path: str | Path, threads: int | None = None, key: str = "ckpt") -> OnnxModel:
    """An imgcls ONNX export; a missing file, a file that is not ONNX, or one without imgcls metadata is one
    CheckpointError line."""
    import onnxruntime as ort

    file = Path(path).expanduser()
    if not file.is_file():
        raise not_a_file(file, key)
    try:
        session = ort.InferenceSession(str(file), session_options(threads), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types for bad files
        raise CheckpointError(f"{key}={path} is not a readable ONNX model ({type(exc).__name__})") from None
    raw = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if raw is None:
        raise CheckpointError(f"{key}={path} has no imgcls metadata (export it with python -m imgcls.export)")
    try:
        metadata = json.loads(raw)
    except ValueError:
        metadata = None
    if (
        not isinstance(metadata, dict)
        or not isinstance(metadata.get("classes"), list)
        or not isinstance(metadata.get("preprocessing"), dict)
    ):
        raise CheckpointError(f"{key}={path} has unreadable imgcls metadata (re-export it)")
    # An ONNX file is as untrusted as a checkpoint (inference/trained.py): its classes and preprocessing are
    # checked to be plain values before they reach a transform or a config.
    source = f"{key}={path}"
    metadata["classes"] = checked_classes(metadata["classes"], source)
    metadata["preprocessing"] = checked_preprocessing(metadata["preprocessing"], source)
    metadata["image_size"] = metadata["preprocessing"]["image_size"]
    return OnnxModel(session, str(path), metadata)
