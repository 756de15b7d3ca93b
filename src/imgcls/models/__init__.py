"""Networks: built with timm, initialized the NVIDIA way, optionally loaded from a weights file."""

from imgcls.models.factory import build_network

__all__ = ["build_network"]
