"""Validate an ImageFolder root and find its classes, with one-line errors for user mistakes."""

from __future__ import annotations

from pathlib import Path

from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

from imgcls.errors import DataError


def split_dir(root: str | Path | None, split: str) -> Path:
    if root is None or str(root) in ("", "???"):
        raise DataError("data.root is not set; pass data.root=/path/to/dataset (with train/ and val/ inside)")
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


def check_same_classes(train: list[str], val: list[str], root: str | Path) -> None:
    if train != val:
        only_train = sorted(set(train) - set(val))[:5]
        only_val = sorted(set(val) - set(train))[:5]
        raise DataError(
            f"data.root={root}: val classes differ from train classes "
            f"(only in train: {only_train or '-'}, only in val: {only_val or '-'})"
        )
