"""`python -m imgcls.export ckpt=PATH format=triton repo=DIR [name=NAME] [max_batch=128] [trt_precision=fp32|fp16]
[tensorrt=false]`: a Triton Inference Server model repository.

    DIR/NAME/config.pbtxt   platform onnxruntime_onnx (tensorrt_plan when a TensorRT engine was built here),
                            input "images" TYPE_FP32 [3, S, S], output "logits" TYPE_FP32 [classes] with
                            labels.txt (Triton's classification extension), max_batch_size, dynamic batching
    DIR/NAME/1/model.onnx   the ONNX export of imgcls.export (same graph, same metadata)
    DIR/NAME/labels.txt     one class name a line, in logit order
    DIR/NAME/README.md      the preprocessing a JPEG needs before it is sent (resize, crop, mean, std)

Precision: the I/O stays fp32 whatever trt_precision says. fp16 is a TensorRT build choice (trtexec --fp16, or
onnxruntime's TensorRT accelerator with precision_mode FP16 in the config): clients send the same fp32 tensors
either way, and the fp32 model.onnx is what can be verified here on CPU (onnxruntime's CPU kernels run few fp16
ops, so an fp16 graph could not be checked before it reaches a GPU server).

This module does not import imgcls.export (that package calls it): the ONNX writer is passed in.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from imgcls.config.schema import DataSchema
from imgcls.data.transforms import val_resize_size
from imgcls.errors import ConfigError, StorageError
from imgcls.inference.trained import TrainedModel
from imgcls.storage import readable_mode
from imgcls.typed_config import settings

INPUT, OUTPUT = "images", "logits"  # the names export_onnx gives the graph's input and output
PRECISIONS = ("fp32", "fp16")
# Triton's model names become folder names and URL path parts (/v2/models/NAME): no slash, no leading dot.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
QUEUE_DELAY_US = 100  # dynamic batching waits at most 0.1 ms to fill a batch: latency stays about unchanged


def options(cfg: DictConfig) -> dict[str, Any]:
    """The triton keys, checked before the checkpoint is loaded (a typo costs no model load)."""
    try:  # the config check needs Triton's protobuf definitions: say so before the checkpoint is loaded
        import tritonclient.grpc.model_config_pb2  # noqa: F401
    except ImportError:
        raise ConfigError("format=triton needs tritonclient: pip install 'tritonclient[grpc]' (export extra)") from None
    if not cfg.get("repo"):
        raise ConfigError("format=triton needs repo=DIR (the Triton model repository to write into)")
    repo = Path(str(cfg.repo)).expanduser()
    if repo.exists() and not repo.is_dir():
        raise ConfigError(f"repo={repo} is a file, not a folder")
    name = cfg.get("name")
    if name is not None and not NAME_PATTERN.fullmatch(str(name)):
        raise ConfigError(f"name={name} must be a plain folder name (letters, digits, _ . -; no slash, no leading dot)")
    max_batch = cfg.get("max_batch")
    if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
        raise ConfigError(f"max_batch={max_batch} must be a positive integer (Triton's max_batch_size)")
    precision = str(cfg.get("trt_precision"))
    if precision not in PRECISIONS:
        raise ConfigError(f"trt_precision={precision} is not allowed; use {', '.join(PRECISIONS)}")
    if not isinstance(cfg.get("tensorrt"), bool):
        raise ConfigError(f"tensorrt={cfg.get('tensorrt')} must be true or false")
    if name is not None:
        _refuse_non_empty(repo / str(name))  # the default name needs the checkpoint's arch: checked after loading
    return {
        "repo": repo,
        "name": None if name is None else str(name),
        "max_batch": max_batch,
        "precision": precision,
        "tensorrt": cfg.tensorrt,
    }


def model_dir_of(opts: dict[str, Any], trained: TrainedModel) -> Path:
    """DIR/NAME, refused when it holds anything: what is there may be another model, never ours to replace."""
    name = opts["name"] or trained.arch
    if not NAME_PATTERN.fullmatch(name):  # a default name from an arch such as "timm/x" (name= was checked)
        raise ConfigError(f"the model name {name} (the arch) is not a folder name; pass name=NAME")
    target = opts["repo"] / name
    _refuse_non_empty(target)
    return target


def _refuse_non_empty(target: Path) -> None:
    if os.path.lexists(target) and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target} already exists and is not empty; remove it or pass name=OTHER")


def write_repository(trained: TrainedModel, opts: dict[str, Any], write_onnx: Callable[[Path], None]) -> dict:
    target = model_dir_of(opts, trained)
    size = int(trained.preprocessing["image_size"])
    engine_note = None
    opts["repo"].mkdir(parents=True, exist_ok=True)
    # Built in a hidden sibling, renamed into place at the end: a failed export leaves no half model for Triton.
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=opts["repo"]))
    try:
        (tmp / "1").mkdir()
        write_onnx(tmp / "1" / "model.onnx")
        platform = "onnxruntime_onnx"
        if opts["tensorrt"]:
            if trtexec_usable():
                build_engine(tmp / "1", size, opts["max_batch"], opts["precision"])
                platform = "tensorrt_plan"  # Triton loads 1/model.plan; model.onnx stays as its source
            else:
                engine_note = (
                    "tensorrt=true skipped (no CUDA GPU or no trtexec here); the ONNX Runtime repository is "
                    f"complete; on the GPU server: {trtexec_command(target / '1', size, opts['max_batch'], opts['precision'])}"  # noqa: E501
                    ' and set platform: "tensorrt_plan" in config.pbtxt (and drop its optimization block)'
                )
        (tmp / "labels.txt").write_text("".join(f"{c}\n" for c in trained.classes))
        (tmp / "config.pbtxt").write_text(
            config_text(target.name, platform, size, len(trained.classes), opts["max_batch"], opts["precision"])
        )
        (tmp / "README.md").write_text(readme_text(trained, target, opts))
        os.chmod(tmp, readable_mode(directory=True))  # mkdtemp makes 0700; a Triton server user must read it
        check_repository(tmp)  # parsed with Triton's protobuf and compared with the ONNX graph before it goes live
        try:
            os.replace(tmp, target)  # an empty target folder is replaced; a non-empty one was refused above
        except OSError as exc:  # filled (ENOTEMPTY/EEXIST) since that check, e.g. by a concurrent export
            raise StorageError(
                f"could not publish {target} ({exc.strerror or type(exc).__name__}); it was left as it is, "
                "remove it or pass name=OTHER"
            ) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)  # ours alone: mkdtemp made it
    print(
        f"imgcls: wrote Triton model {target} ({platform}, {trained.arch}, {len(trained.classes)} classes, "
        f"max_batch {opts['max_batch']}, {'ema' if trained.ema else 'raw'} weights)"
    )
    if engine_note:
        print(f"imgcls: note: {engine_note}")
    return {
        "output": str(target),
        "format": "triton",
        "platform": platform,
        "arch": trained.arch,
        "classes": len(trained.classes),
        "weights": "ema" if trained.ema else "raw",
        "tensorrt_skipped": engine_note is not None,
    }


def model_config(name: str, platform: str, size: int, classes: int, max_batch: int, precision: str) -> Any:
    """Triton's inference.ModelConfig of the model (tritonclient's protobuf message). Dims leave out the batch
    axis: max_batch_size > 0 tells Triton the first axis of every tensor is the batch."""
    from tritonclient.grpc import model_config_pb2 as pb

    config = pb.ModelConfig(name=name, platform=platform, max_batch_size=max_batch)
    config.input.add(name=INPUT, data_type=pb.TYPE_FP32, format=pb.ModelInput.FORMAT_NCHW, dims=[3, size, size])
    config.output.add(name=OUTPUT, data_type=pb.TYPE_FP32, dims=[classes], label_filename="labels.txt")
    config.dynamic_batching.max_queue_delay_microseconds = QUEUE_DELAY_US
    if precision == "fp16" and platform == "onnxruntime_onnx":
        # onnxruntime's TensorRT execution provider builds fp16 kernels on the server's GPU; I/O stays fp32.
        accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
        accelerators.add(name="tensorrt").parameters["precision_mode"] = "FP16"
    return config


def config_text(name: str, platform: str, size: int, classes: int, max_batch: int, precision: str) -> str:
    """config.pbtxt: model_config in protobuf text format, the form Triton reads."""
    from google.protobuf import text_format

    config = model_config(name, platform, size, classes, max_batch, precision)
    return text_format.MessageToString(config, use_short_repeated_primitives=True)


def trtexec_command(version_dir: Path, size: int, max_batch: int, precision: str) -> str:
    shape = f"3x{size}x{size}"
    opt = max(1, max_batch // 2)
    return (
        f"trtexec --onnx={version_dir / 'model.onnx'} --saveEngine={version_dir / 'model.plan'} "
        f"--minShapes={INPUT}:1x{shape} --optShapes={INPUT}:{opt}x{shape} --maxShapes={INPUT}:{max_batch}x{shape}"
        + (" --fp16" if precision == "fp16" else "")
    )


def trtexec_usable() -> bool:
    return shutil.which("trtexec") is not None and torch.cuda.is_available()


def build_engine(version_dir: Path, size: int, max_batch: int, precision: str) -> None:
    command = trtexec_command(version_dir, size, max_batch, precision)
    result = subprocess.run(command.split(), capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"trtexec failed (exit {result.returncode}): {last[0]}")


def readme_text(trained: TrainedModel, target: Path, opts: dict[str, Any]) -> str:
    pre = trained.preprocessing
    size = int(pre["image_size"])
    resize = val_resize_size(settings(DataSchema, pre), size)
    mean, std = list(pre["mean"]), list(pre["std"])
    return f"""# {target.name}: {trained.arch}, {len(trained.classes)} classes (exported by imgcls)

Triton model repository entry: `config.pbtxt`, `1/model.onnx`, `labels.txt` (class names in logit order).

## Input a JPEG needs (the checkpoint's validation preprocessing)

1. Decode to RGB.
2. Resize the shorter side to {resize} pixels ({pre.get("interpolation")} interpolation), keeping the aspect ratio.
3. Center crop {size}x{size}.
4. Scale to [0, 1] (divide by 255), then normalize per channel: (x - mean) / std with
   mean = {mean}, std = {std}.
5. Send `{INPUT}` as FP32, NCHW, shape [batch, 3, {size}, {size}], batch <= {opts["max_batch"]}.

Output `{OUTPUT}`: FP32 [batch, {len(trained.classes)}] raw logits (softmax for probabilities); ask Triton for
`class_count=k` to get the top k labels from labels.txt.

## TensorRT (GPU only)

    {trtexec_command(target / "1", size, opts["max_batch"], opts["precision"])}

then set `platform: "tensorrt_plan"` in config.pbtxt and drop its `optimization` block, if any (it configures
onnxruntime). The engine is specific to the GPU and TensorRT version:
build it on the server.
"""


def check_repository(model_dir: Path) -> Any:
    """Parse config.pbtxt with Triton's own protobuf definitions and check it against model.onnx's inputs and
    outputs (names, dtypes, dims); a mismatch Triton would refuse at load time is raised here instead.
    Returns the parsed inference.ModelConfig."""
    import onnx
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    graph = onnx.load(str(model_dir / "1" / "model.onnx"), load_external_data=False).graph
    onnx_to_triton = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16"}
    for declared, actual in ((config.input, graph.input), (config.output, graph.output)):
        if [t.name for t in declared] != [t.name for t in actual]:
            raise ConfigError(f"config.pbtxt names {[t.name for t in declared]}, model.onnx {[t.name for t in actual]}")
        for entry, tensor in zip(declared, actual, strict=True):
            dtype = model_config_pb2.DataType.Name(entry.data_type)
            onnx_dtype = onnx_to_triton.get(tensor.type.tensor_type.elem_type)
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.type.tensor_type.shape.dim]
            # The ONNX batch axis is dynamic (-1); the config leaves it out when max_batch_size > 0.
            want = [-1, *entry.dims] if config.max_batch_size > 0 else list(entry.dims)
            if dtype != onnx_dtype or dims != want:
                raise ConfigError(f"{entry.name}: config.pbtxt {dtype} {want}, model.onnx {onnx_dtype} {dims}")
    labels = (model_dir / "labels.txt").read_text().splitlines()
    if len(labels) != config.output[0].dims[-1]:
        raise ConfigError(f"labels.txt has {len(labels)} lines for {config.output[0].dims[-1]} logits")
    return config
