"""`python -m imgcls.data.shards convert SRC DST format=webdataset|tfrecord shard_size=N [seed=0]`: an
ImageFolder (SRC/{train,val}/<class>/<image>) into shards: TFRecord (TF1 build_imagenet_data.py's names and
labels) or WebDataset tars, deterministic, with a manifest.json written last (its presence marks a complete
conversion). The image files' bytes are copied, not decoded: an unreadable file goes in as it is and meets the
readers' bad-image policy (data.on_bad_image) like the folder's would. docs/shards.md.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from imgcls.data.shards import tfrecord, webdataset
from imgcls.data.shards.formats import FORMATS
from imgcls.data.shards.manifest import INDEX_DIR, MANIFEST, manifest_document, write_manifest
from imgcls.errors import ConfigError, DataError
from imgcls.storage import write_atomic

USAGE = "python -m imgcls.data.shards convert SRC DST format=webdataset|tfrecord shard_size=N [seed=0]"
KEYS = ("format", "shard_size", "seed")
LABEL_BASE = {"tfrecord": 1, "webdataset": 0}  # tfrecord: 1..N as TF1, so NVIDIA's TF scripts read ours unchanged
SPLIT_PREFIX = {"train": "train", "val": "validation"}  # TF1's shard names


def shard_name(fmt: str, split: str, index: int, total: int) -> str:
    name = f"{SPLIT_PREFIX[split]}-{index:05d}-of-{total:05d}"
    return name + ".tar" if fmt == "webdataset" else name


def shard_bounds(count: int, shard_size: int) -> list[tuple[int, int]]:
    """ceil(count / shard_size) shards whose sizes differ by at most one (TF1's even split): equal shards keep
    the ranks' shard reads balanced."""
    shards = max(1, math.ceil(count / shard_size))
    return [(i * count // shards, (i + 1) * count // shards) for i in range(shards)]


def check_destination(dst: Path) -> None:
    if not dst.exists() or dst.is_dir() and not any(dst.iterdir()):
        return
    what = "is not a folder" if not dst.is_dir() else "exists and is not empty"
    if dst.is_dir() and (dst / MANIFEST).exists():
        what += f" (it holds a complete conversion: {MANIFEST})"
    elif dst.is_dir() and any(p.name.startswith(("train-", "validation-")) for p in dst.iterdir()):
        what += f" (shards without {MANIFEST}: an interrupted conversion? delete it and run again)"
    raise DataError(f"DST={dst} {what}; the converter writes only into a new or empty folder (nothing was written)")


def folder_samples(src: Path) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """The classes and each split's (path, label) list, in ImageFolder's order (so its labels)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    from imgcls.data.folder import folder_classes, split_dir

    try:
        classes = folder_classes(src)
    except DataError as exc:  # folder.py names data.root, the training key; here the folder is SRC
        raise DataError(str(exc).replace("data.root=", "SRC=")) from None
    index = {c: i for i, c in enumerate(classes)}
    samples = {}
    for split in ("train", "val"):
        try:
            samples[split] = make_dataset(str(split_dir(src, split)), index, extensions=IMG_EXTENSIONS)
        except FileNotFoundError as exc:  # a class folder without images
            raise DataError(f"SRC={src}: {str(exc).splitlines()[0]}") from None
    return classes, samples


def convert(src: str | Path, dst: str | Path, fmt: str, shard_size: int, seed: int = 0, progress: bool = True) -> Path:
    """Write the shards of SRC into DST (new or empty); returns the manifest's path."""
    if fmt not in FORMATS:
        raise ConfigError(f"format={fmt} is not allowed; allowed: {', '.join(FORMATS)}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ConfigError(f"shard_size={shard_size} is not allowed; a positive integer (images per shard)")
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if not src.is_dir():
        raise DataError(f"SRC={src} is not a folder; expected SRC/train/<class>/<image> and SRC/val/<class>/<image>")
    check_destination(dst)
    classes, samples = folder_samples(src)
    # A sorted folder would put one class in each shard, and a shard-level shuffle cannot undo that.
    samples["train"] = [samples["train"][i] for i in np.random.default_rng(seed).permutation(len(samples["train"]))]

    dst.mkdir(parents=True, exist_ok=True)
    written: dict[str, list[tuple[str, int]]] = {}
    for split in ("train", "val"):
        items, base = samples[split], src / split
        bounds = shard_bounds(len(items), shard_size)
        written[split] = []
        with tqdm(total=len(items), desc=f"{split} -> {fmt}", unit="img", disable=not progress) as bar:
            for i, (start, end) in enumerate(bounds):
                name = shard_name(fmt, split, i, len(bounds))
                _write_shard(dst, name, fmt, items[start:end], base, classes)
                written[split].append((name, end - start))
                bar.update(end - start)
    document = manifest_document(
        fmt, LABEL_BASE[fmt], classes, written, source=str(src.resolve()), seed=seed, shard_size=shard_size
    )
    return write_manifest(dst, document)


def _write_shard(dst: Path, name: str, fmt: str, items: list[tuple[str, int]], base: Path, classes: list[str]) -> None:
    # Each shard goes to a temp name in DST and is renamed: a killed conversion leaves no short shard.
    label_base = LABEL_BASE[fmt]
    if fmt == "webdataset":

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as out:
                writer = webdataset.ShardWriter(out)
                for path, label in items:
                    # Every image as KEY.jpg whatever its suffix (decoders read the content): one extension lets
                    # DALI's reader take ext=["jpg", "cls"].
                    writer.write(webdataset.key_of(_relative(path, base)), _read(path), label + label_base)
                writer.close()

        write_atomic(dst / name, write, what="shard")
        return

    spans: list[tuple[int, int]] = []

    def write_records(tmp: Path) -> None:
        spans.clear()
        offset = 0
        with open(tmp, "wb") as out:
            for path, label in items:
                record = tfrecord.encode_example(
                    _read(path), label + label_base, filename=_relative(path, base), synset=classes[label]
                )
                length = tfrecord.write_record(out, record)
                spans.append((offset, length))
                offset += length

    write_atomic(dst / name, write_records, what="shard")
    text = tfrecord.index_text(spans)
    write_atomic(dst / INDEX_DIR / f"{name}.idx", lambda tmp: tmp.write_text(text), what="DALI index file")


def _relative(path: str, base: Path) -> str:
    prefix = str(base) + os.sep  # make_dataset joins its paths onto the split folder: a prefix cut suffices
    relative = path[len(prefix) :] if path.startswith(prefix) else os.path.relpath(path, base)
    return relative.replace(os.sep, "/")


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None


# --- the command ------------------------------------------------------------------------------------------


def _integer(key: str, value: str, low: int, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if number < low:
        raise ConfigError(f"{key}={value} is not allowed; {what} (usage: {USAGE})")
    return number


def parse(argv: list[str]) -> dict:
    """SRC, DST and the key=value arguments, each mistake one ConfigError line."""
    positional = [a for a in argv if "=" not in a]
    pairs = [a.partition("=") for a in argv if "=" in a]
    if len(positional) != 2:
        raise ConfigError(f"expected SRC and DST, got {len(positional)} path(s) {positional}; usage: {USAGE}")
    args: dict = {"src": positional[0], "dst": positional[1], "seed": 0}
    for key, _, value in pairs:
        if key not in KEYS:
            raise ConfigError(f"unknown argument {key}={value}; allowed: {', '.join(KEYS)} (usage: {USAGE})")
        if key == "format":
            if value not in FORMATS:
                raise ConfigError(f"format={value} is not allowed; allowed: {', '.join(FORMATS)}")
            args["format"] = value
        elif key == "shard_size":
            args["shard_size"] = _integer(key, value, 1, "a positive integer (images per shard, e.g. 1250)")
        else:
            args["seed"] = _integer(key, value, 0, "an integer >= 0")
    for key in ("format", "shard_size"):
        if key not in args:
            raise ConfigError(f"{key} is not set; usage: {USAGE}")
    return args


def main(argv: list[str]) -> int:
    """`python -m imgcls.data.shards convert ...` (the dispatch and the error line are in __main__.py)."""
    args = parse(argv)
    path = convert(args["src"], args["dst"], args["format"], args["shard_size"], args["seed"])
    print(f"wrote {path}")
    return 0
