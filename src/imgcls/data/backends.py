"""The choice of data backend (data.backend): each one turns the data config into loaders (data/protocol.py).

The LightningModule and the DataModule never see which backend runs. DALI is imported only when chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from imgcls.data.protocol import DataBackend
from imgcls.data.synthetic import SyntheticBackend
from imgcls.data.torchvision.backend import make_torchvision_backend
from imgcls.errors import ConfigError

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema


def _dali(device: str) -> Callable[[DataSchema], Any]:
    """Import DALI only when a DALI backend is chosen; a missing package is a one-line config error."""

    def build(cfg: DataSchema) -> Any:
        try:
            from imgcls.data.dali.backend import DaliBackend
        except ImportError as exc:
            raise ConfigError(
                f"data.backend={cfg.backend} needs NVIDIA DALI, which does not import here ({exc}); "
                "pip install nvidia-dali-cuda120 (or -cuda130), or use data.backend=torchvision"
            ) from None
        return DaliBackend(cfg, device)

    return build


BACKENDS: dict[str, Callable[[DataSchema], Any]] = {
    "torchvision": make_torchvision_backend,
    "synthetic": SyntheticBackend,
    "dali_cpu": _dali("cpu"),  # DALI decode + augment on CPU threads (NVIDIA: DGX-1, DGX A100)
    "dali_gpu": _dali("gpu"),  # nvJPEG decode + GPU augment (NVIDIA: DGX-2)
}


def make_backend(cfg: DataSchema) -> DataBackend:
    return BACKENDS[cfg.backend](cfg)  # one of config.choices DATA_BACKENDS (config/checks.py)
