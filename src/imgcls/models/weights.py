"""Load a weights-only file (ours, timm's or torchvision's state_dict) into a network."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from imgcls.errors import CheckpointError

# Prefixes that wrappers put in front of the network's own keys.
_PREFIXES = ("module.", "net.", "model.", "_orig_mod.")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise CheckpointError(f"model.weights={path} does not exist")
    try:
        blob: Any = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not a weights file"
        raise CheckpointError(f"model.weights={path} is not a PyTorch weights file ({type(exc).__name__})") from None
    if isinstance(blob, dict) and "state_dict" in blob:
        blob = blob["state_dict"]
    if not isinstance(blob, dict) or not all(isinstance(v, torch.Tensor) for v in blob.values()):
        raise CheckpointError(f"model.weights={path} holds no state_dict")
    return {_strip(k): v for k, v in blob.items() if not _strip(k).startswith("ema.")}


def _strip(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def load_weights(net: nn.Module, path: str | Path, arch: str) -> None:
    """Load weights; a head of another class count is dropped (and stays freshly initialized)."""
    state = read_state_dict(path)
    own = net.state_dict()
    head = str(getattr(net, "pretrained_cfg", {}).get("classifier", "fc"))
    mismatched_head = [k for k in state if k.startswith(head + ".") and k in own and state[k].shape != own[k].shape]
    for key in mismatched_head:
        del state[key]
    missing = [k for k in own if k not in state and k not in mismatched_head]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in state if k in own and state[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"model.weights={path} does not fit model {arch}: "
            f"{len(missing)} missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}), "
            f"{len(wrong)} of another shape (e.g. {wrong[:3]})"
        )
    net.load_state_dict(state, strict=False)
