"""`python -m imgcls.classify CKPT IMAGE... [--json]` (or `ckpt=PATH images=[a.jpg,some/dir]`): top-5 classes per
image.

ckpt is a training checkpoint, a weights export, an ONNX export fp32 or INT8 (`backend=onnx`, or any `.onnx`
file: inference/onnx_model.py), or a plain state_dict (timm's, torchvision's, NVIDIA's NGC files) given
`model=NAME`. Images go through the val preprocessing the model was trained with (resize to size/crop_pct,
e.g. 256, center crop to the model's size, normalize); a plain state_dict gets the one imgcls trains
`model=NAME` with. Folders are read recursively and classified in batches. A file that cannot be decoded is
reported by name and the others are still classified (exit code 1); when no image at all can be read it is
one error line (exit code 2).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS

from imgcls.config.compose import compose_train, model_config, required_ckpt
from imgcls.config.schema import DataSchema
from imgcls.data.imagenet_classes import display_names
from imgcls.data.transforms import val_transform
from imgcls.errors import ConfigError, DataError
from imgcls.inference.onnx_model import load_onnx
from imgcls.inference.trained import PREPROCESSING_KEYS, load_trained
from imgcls.typed_config import settings


class Predictor:
    """logits = predictor(batch NCHW float); with the classes and preprocessing of the model."""

    def __init__(self, forward: Callable[[torch.Tensor], np.ndarray], classes: list[str], preprocessing: dict) -> None:
        self.forward = forward
        self.classes = classes
        self.preprocessing = preprocessing

    def __call__(self, images: torch.Tensor) -> np.ndarray:
        return self.forward(images)


def load_predictor(
    ckpt: str, backend: str = "auto", use_ema: bool = False, model_cfg: dict[str, Any] | None = None
) -> Predictor:
    """model_cfg (`model=NAME`, resolved): what a plain state_dict holds; an imgcls file must agree with it."""
    if backend == "auto":
        backend = "onnx" if ckpt.lower().endswith(".onnx") else "torch"
    if backend == "onnx":
        if model_cfg is not None:
            raise ConfigError(f"model={model_cfg['name']} is for torch weights files; an ONNX export names its own")
        return _onnx_predictor(ckpt)
    if backend != "torch":
        raise ConfigError(f"backend={backend} is not allowed; use auto, torch or onnx")
    preprocessing = model_preprocessing(model_cfg["name"]) if model_cfg is not None else None
    trained = load_trained(ckpt, use_ema, model_cfg=model_cfg, preprocessing=preprocessing)
    net = trained.net.float().eval()

    def forward(images: torch.Tensor) -> np.ndarray:
        with torch.inference_mode():
            return net(images).float().numpy()

    return Predictor(forward, trained.classes, trained.preprocessing)


def model_preprocessing(model_name: str) -> dict[str, Any]:
    """The val preprocessing imgcls trains `model=NAME` with (its image size, crop, interpolation, mean and
    std), for a plain state_dict, which carries none (as evaluate.py does for such files)."""
    data = compose_train(["data=folder", f"model={model_name}"]).data
    return {k: OmegaConf.select(data, k) for k in PREPROCESSING_KEYS}


def _onnx_predictor(path: str) -> Predictor:
    model = load_onnx(path)  # fp32 or INT8 export: the same session loader as evaluate.py and the benchmark
    return Predictor(model, model.classes, model.preprocessing)


def image_paths(images: Any) -> list[Path]:
    """Files as given; folders expanded (recursively, sorted) to the image files inside them."""
    if images is None or images == "":
        raise ConfigError("images=[FILE_OR_DIR,...] is required (or the images after the checkpoint: CKPT IMAGE...)")
    items = list(images) if isinstance(images, (list, tuple, ListConfig)) else [images]
    paths: list[Path] = []
    for item in items:
        path = Path(str(item)).expanduser()
        if path.is_dir():
            paths.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS))
        else:
            paths.append(path)  # a missing file is reported with the others
    if not paths:
        raise DataError(f"images={items} holds no image files ({', '.join(IMG_EXTENSIONS)})")
    return paths


def _chunks(items: list[Path], size: int) -> Iterator[list[Path]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def classify(predictor: Predictor, paths: list[Path], batch_size: int = 32, topk: int = 5) -> list[dict[str, Any]]:
    """One result per path: {"path", "top": [{"class", "name", "prob"}...]} or {"path", "error"}."""
    if batch_size <= 0:
        raise ConfigError(f"batch_size={batch_size} must be positive")
    transform = val_transform(settings(DataSchema, predictor.preprocessing))
    names = display_names(predictor.classes)
    k = min(topk, len(predictor.classes))
    results: list[dict[str, Any]] = []
    for chunk in _chunks(paths, batch_size):
        tensors, done = [], []
        for path in chunk:
            try:
                with Image.open(path) as image:
                    tensors.append(transform(image.convert("RGB")))
                done.append(path)
            except FileNotFoundError:
                results.append({"path": str(path), "error": "no such file"})
            except (OSError, ValueError, Image.DecompressionBombError) as exc:
                results.append({"path": str(path), "error": f"cannot decode image ({exc})"})
        if not tensors:
            continue
        probs = torch.softmax(torch.from_numpy(predictor(torch.stack(tensors))).float(), dim=1)
        values, indices = probs.topk(k, dim=1)
        for path, vals, idxs in zip(done, values.tolist(), indices.tolist()):
            top = [{"class": predictor.classes[i], "name": names[i], "prob": v} for v, i in zip(vals, idxs)]
            results.append({"path": str(path), "top": top})
    order = {str(p): i for i, p in enumerate(paths)}
    return sorted(results, key=lambda r: order[r["path"]])


def run(cfg: DictConfig) -> dict[str, Any]:
    ckpt = required_ckpt(cfg)
    paths = image_paths(cfg.get("images"))
    predictor = load_predictor(ckpt, str(cfg.backend), bool(cfg.use_ema), model_config(cfg))
    results = classify(predictor, paths, int(cfg.batch_size), int(cfg.topk))
    failed = [r for r in results if "error" in r]
    if len(failed) == len(results):
        first = failed[0]
        more = f" (and {len(failed) - 1} more files)" if len(failed) > 1 else ""
        raise DataError(f"{first['path']}: {first['error']}{more}")
    if cfg.get("json"):
        print(json.dumps(results, indent=2))
    else:
        for result in results:
            if "error" in result:
                continue
            print(result["path"])
            for entry in result["top"]:
                label = entry["name"] if entry["name"] == entry["class"] else f"{entry['name']} ({entry['class']})"
                print(f"  {100 * entry['prob']:6.2f}%  {label}")
    for result in failed:
        print(f"imgcls: error: {result['path']}: {result['error']}", file=sys.stderr)
    return {"results": results, "failed": len(failed)}
