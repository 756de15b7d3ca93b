"""Validate an ImageFolder root and find its classes, with one-line errors for user mistakes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

from imgcls.errors import DataError


def split_dir(root: str | Path | None, split: str) -> Path:
    if root is None or str(root) in ("", "???"):
        raise DataError("data.root is not set; pass data.root=/path/to/dataset (with train/ and val/ inside)")
    if "://" in str(root):  # Path() would fold s3://bucket into s3:/bucket
        raise DataError(
            f"data.root={root} is a URL, and an image folder (data.format=folder) is a local path; shards in a "
            "bucket are data.format=webdataset or tfrecord (docs/shards.md)"
        )
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"data.root={root} does not exist or is not a directory")
    path = root / split
    if not path.is_dir():
        raise DataError(f"data.root={root} has no '{split}' folder; expected {root}/{split}/<class>/<image>")
    return path


def classes_of(root: str | Path | None, split: str) -> list[str]:
    """Sorted class folder names of ROOT/SPLIT, the same order (and so labels) as ImageFolder."""
    path = split_dir(root, split)
    try:
        classes, _ = find_classes(str(path))
    except FileNotFoundError:
        raise DataError(f"{path} has no class folders; expected {path}/<class>/<image>.jpg") from None
    has_images = any(f.suffix.lower() in IMG_EXTENSIONS for c in classes for f in (path / c).iterdir() if f.is_file())
    if not has_images:
        raise DataError(f"{path} has class folders but no images ({', '.join(IMG_EXTENSIONS)})")
    return classes


def folder_classes(root: str | Path | None, named: Sequence[str] | None = None) -> list[str]:
    """An image folder's classes: train/'s, which val/ must repeat. Where the class names are given (evaluate: the
    checkpoint's) a root with val/ alone is enough: its folders are compared with those names by the caller."""
    if named and root is not None and not (Path(root).expanduser() / "train").is_dir():
        return classes_of(root, "val")
    classes = classes_of(root, "train")
    check_same_classes(classes, classes_of(root, "val"), str(root))
    return classes


def check_same_classes(train: list[str], val: list[str], root: str | Path) -> None:
    if train != val:
        only_train = sorted(set(train) - set(val))[:5]
        only_val = sorted(set(val) - set(train))[:5]
        raise DataError(
            f"data.root={root}: val classes differ from train classes "
            f"(only in train: {only_train or '-'}, only in val: {only_val or '-'})"
        )
