"""Human-readable names of the ImageNet-1k classes (wnids such as n01440764 -> "tench")."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_FILE = Path(__file__).with_name("imagenet_classes.tsv")


@cache
def imagenet_names() -> dict[str, str]:
    """wnid -> name, in label order (the sorted wnids, as ImageFolder numbers them)."""
    rows = (line.split("\t") for line in _FILE.read_text().splitlines() if line and not line.startswith("#"))
    return {wnid: name for wnid, name in rows}


def display_names(classes: list[str]) -> list[str]:
    """The class names to print: human-readable for ImageNet wnids, the class folder names otherwise."""
    names = imagenet_names()
    return [names.get(c, c) for c in classes]
