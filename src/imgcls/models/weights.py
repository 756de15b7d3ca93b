"""Weights files: read ours, timm's, torchvision's or NVIDIA's state_dicts and load them into a network.

Three kinds of file hold a network:
- an imgcls training checkpoint (Lightning .ckpt: `state_dict` with `net.*` / `ema.module.*` keys,
  `hyper_parameters` with the model, classes and run config);
- an imgcls weights export (`python -m imgcls.export format=weights`, NVIDIA's checkpoint2model): a plain
  state_dict plus metadata (arch, model config, classes, preprocessing);
- a foreign state_dict (timm's or torchvision's files, NVIDIA's NGC files and main.py checkpoints in either
  of their key layouts: models/nvidia_weights.py): keys only, the user names the model.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from imgcls.errors import CheckpointError
from imgcls.models.nvidia_weights import LAYOUTS

TIMM_LAYOUT = "timm/torchvision (layer1.0.conv1, blocks.0.0, se.fc1)"

# Prefixes that wrappers put in front of the network's own keys.
_PREFIXES = ("module.", "net.", "model.", "_orig_mod.")
EXPORT_FORMAT = "imgcls.weights/1"


def read_torch_file(path: str | Path, key: str = "ckpt") -> Any:
    """torch.load on CPU with one-line errors naming the config key the path came from."""
    path = Path(str(path)).expanduser()
    if not path.is_file():
        raise not_a_file(path, key)
    try:
        return safe_torch_load(path)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        kind = file_kind(path)
        if kind is not None:
            raise CheckpointError(
                f"{key}={path} is {kind}, not a checkpoint: pass a .ckpt of train.py, a file of imgcls.export or a "
                "state_dict (.pth)"
            ) from None
        why = why_unreadable(exc)
        raise CheckpointError(f"{key}={path} is not a PyTorch checkpoint or weights file ({why})") from None


# The names of the files a checkpoint path may give: train.py's, imgcls.export's, timm's / torchvision's / NVIDIA's.
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".pth.tar", ".onnx")
SHOWN = 4  # checkpoints named in a line; the rest are counted


def not_a_file(path: Path, key: str) -> CheckpointError:
    """A path that is no file: a folder (the checkpoints in it to pick from, newest first) or nothing at all."""
    if not path.is_dir():
        return CheckpointError(f"{key}={path} does not exist")
    found = checkpoints_in(path)
    if not found:
        kinds = ", ".join(CHECKPOINT_SUFFIXES)
        return CheckpointError(f"{key}={path} is a folder and holds no checkpoint ({kinds} files); pass a file")
    more = f" (and {len(found) - SHOWN} more)" if len(found) > SHOWN else ""
    named = ", ".join(str(p) for p in found[:SHOWN])
    return CheckpointError(f"{key}={path} is a folder; pass one of its checkpoints, newest first: {named}{more}")


def checkpoints_in(folder: Path, depth: int = 4, budget: int = 20_000) -> list[Path]:
    """The checkpoint files under folder (a run dir's checkpoints/ is 2 levels down from outputs/TASK), newest
    first; a look, not a crawl: `depth` levels, `budget` entries (a dataset folder holds millions of images)."""
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        level = len(Path(root).relative_to(folder).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if level < depth else []
        budget -= len(dirs) + len(files)
        found += [Path(root) / f for f in files if f.endswith(CHECKPOINT_SUFFIXES)]
        if budget < 0:
            break
    return sorted(found, key=_modified, reverse=True)


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


# Text files by name: what a user may pass by mistake where a checkpoint belongs (README.md, a config).
TEXT_KINDS = {
    ".md": "a Markdown file", ".txt": "a text file", ".yaml": "a YAML file", ".yml": "a YAML file",
    ".json": "a JSON file", ".py": "a Python file", ".csv": "a CSV file", ".log": "a log file",
}  # fmt: skip


def file_kind(path: Path) -> str | None:
    """What a file that torch cannot load is, from its first bytes: an image (PIL's format name), a text file (by
    its name), an empty file, a gzip or tar archive; None when it is none of these."""
    from PIL import Image

    try:
        with path.open("rb") as file:
            head = file.read(4096)
    except OSError:
        return None
    if not head:
        return "an empty file"
    try:
        with Image.open(path) as image:
            return f"a {image.format} image"
    except Exception:  # noqa: BLE001 - PIL raises several types for a file that is no image
        pass
    if b"\0" not in head:
        try:
            head.decode("utf-8")
            text = True
        except UnicodeDecodeError as exc:  # a character cut at the end of the 4 KB read is still text
            text = exc.start >= len(head) - 3
        if text:
            return TEXT_KINDS.get(path.suffix.lower(), "a text file")
    if head[:2] == b"\x1f\x8b":
        return "a gzip archive"
    if head[257:262] == b"ustar":
        return "a tar archive"
    return None


def safe_torch_load(path: str | Path, mmap: bool = False) -> Any:
    """torch.load that never runs code from the file. weights_only=True is enough for every file imgcls reads:
    its training checkpoints (Lightning resumes them the same way) and weights exports hold tensors and plain
    containers, as do timm's and torchvision's state_dicts; a file with other Python objects is refused."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def why_unreadable(exc: Exception) -> str:
    if isinstance(exc, pickle.UnpicklingError) and "weights only" in str(exc).lower():
        return "it holds Python objects besides tensors, which are not unpickled: that could run code"
    return type(exc).__name__


def is_training_checkpoint(blob: Any) -> bool:
    return isinstance(blob, dict) and "imgcls" in blob and "hyper_parameters" in blob and "state_dict" in blob


def is_weights_export(blob: Any) -> bool:
    return isinstance(blob, dict) and blob.get("format") == EXPORT_FORMAT


def state_dict_of(blob: Any, path: str | Path, key: str = "model.weights") -> dict[str, torch.Tensor]:
    if isinstance(blob, dict) and "state_dict" in blob:
        blob = blob["state_dict"]
    if not isinstance(blob, dict) or not blob or not all(isinstance(v, torch.Tensor) for v in blob.values()):
        raise CheckpointError(f"{key}={path} holds no state_dict")
    # A whole training checkpoint also fits: its EMA copy is dropped, `net.` is stripped.
    return {_strip(k): v for k, v in blob.items() if not _strip(k).startswith("ema.")}


def read_state_dict(path: str | Path, key: str = "model.weights") -> dict[str, torch.Tensor]:
    return state_dict_of(read_torch_file(path, key), path, key)


def _strip(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def head_name(net: nn.Module) -> str:
    return str(getattr(net, "pretrained_cfg", {}).get("classifier", "fc"))


def in_network_layout(net: nn.Module, state: dict[str, torch.Tensor]) -> tuple[str, dict[str, torch.Tensor]]:
    """The state_dict in the key layout of `net` (timm's): as it is, or converted from one of NVIDIA's
    layouts, whichever fits the network best (most known key names, then most of the right shape; ties keep
    the first, timm's). Returns the layout's name with it, for the error message of a file that fits none."""
    own = net.state_dict()
    candidates = [(TIMM_LAYOUT, state)] + [(layout.name, layout.to_timm(state)) for layout in LAYOUTS]

    def fit(candidate: dict[str, torch.Tensor]) -> tuple[int, int]:
        known = [k for k in candidate if k in own]
        return len(known), sum(1 for k in known if own[k].shape == candidate[k].shape)

    return max(candidates, key=lambda named: fit(named[1]))


def load_state(
    net: nn.Module, state: dict[str, torch.Tensor], source: str, arch: str, new_head_ok: bool = True
) -> None:
    """Load a state_dict whose keys are timm's (torchvision's ResNet/ResNeXt keys are the same, head `fc`
    in both, checked in tests/test_export.py) or NVIDIA's (either published layout, converted). A head of
    another class count is dropped and stays freshly initialized when new_head_ok (fine-tuning); anything
    else that does not fit is one line naming the closest layout and the first keys that do not fit."""
    layout, state = in_network_layout(net, state)
    state = dict(state)
    own = net.state_dict()
    head = head_name(net)
    mismatched_head = [k for k in state if k.startswith(head + ".") and k in own and state[k].shape != own[k].shape]
    if new_head_ok:
        for key in mismatched_head:
            del state[key]
    # timm's published files leave out BN's num_batches_tracked (unused in eval and by momentum BN).
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    missing = [k for k in missing if not (new_head_ok and k in mismatched_head)]
    unexpected = [k for k in state if k not in own]
    wrong = [
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in state
        if k in own and state[k].shape != own[k].shape
    ]
    if missing or unexpected or wrong:
        parts = [
            f"{len(items)} {what} (e.g. {items[:3]})"
            for items, what in ((missing, "missing"), (unexpected, "unexpected"), (wrong, "of another shape"))
            if items
        ]
        # NVIDIA's PyTorch SE-ResNeXt squeezes to 16 channels, imgcls's default to C/16 (squeeze_excitation.py).
        se_width = any(".se.fc" in w for w in wrong)
        se = "; its SE width differs: model.se_width=16 builds NVIDIA's PyTorch SE" if se_width else ""
        raise CheckpointError(
            f"{source} does not fit model {arch}: {', '.join(parts)}; closest key layout: {layout}{se}"
        )
    net.load_state_dict(state, strict=False)
