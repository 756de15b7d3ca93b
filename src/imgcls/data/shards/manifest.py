"""A shard dataset's description: its shards per split with their record counts, classes and label base.

From ROOT/manifest.json (written by `python -m imgcls.data.shards convert`) when present, else from the shard names in
ROOT (TF1 build_imagenet_data.py's train-*/validation-*), with counts from DALI index files or a header scan.
docs/shards.md "Layout" and "manifest.json".
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from imgcls.data.shards import cache, remote, tfrecord, webdataset
from imgcls.data.shards.formats import FORMATS
from imgcls.errors import ConfigError, DataError, StorageError
from imgcls.redaction import redact_url
from imgcls.storage import write_atomic
from imgcls.typed_config import to_dict

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema

MANIFEST = "manifest.json"
SPLITS = ("train", "val")
PREFIXES = {"train": ("train-",), "val": ("validation-", "val-")}  # TF1/TF2 --data_dir names; val- also accepted
DEFAULT_LABEL_BASE = {"tfrecord": 1, "webdataset": 0}  # TF1 writes 1..1000 (the model subtracts 1)
INDEX_DIR = "dali_idx"
# A shard's name in manifest.json or in a listing of ROOT: a plain file name in ROOT. Nothing that reads as a
# path elsewhere, a URL or pipe:CMD (a manifest is data, often from a bucket: it must not run commands or
# point outside ROOT), a shell word (it is pasted into a pipe: root's command), an option (leading -).
SHARD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=@%,-]{0,254}")
ALLOWED_NAME = (
    "a plain file name in data.root: letters, digits and _ . + = @ % , - (not first), no '/', '..', "
    "scheme (pipe:, s3://), space, shell character or control character"
)


@dataclass(frozen=True)
class Shard:
    url: str  # a local path or a URL
    count: int


@dataclass(frozen=True)
class ShardSet:
    format: str
    classes: list[str]
    label_base: int
    splits: dict[str, list[Shard]]  # "train", "val"

    def count(self, split: str) -> int:
        return sum(s.count for s in self.splits[split])

    def label(self, stored: int, where: str = "") -> int:
        """The label (0..classes-1) of a STORED label; out of range is a one-line DataError naming
        data.label_base, the usual cause (TF1 shards read with label_base=0 give 1..1000)."""
        label = int(stored) - self.label_base
        if not 0 <= label < len(self.classes):
            raise DataError(
                f"{where + ': ' if where else ''}stored label {stored} - data.label_base={self.label_base} = {label} "
                f"is outside 0..{len(self.classes) - 1} ({len(self.classes)} classes); check data.label_base "
                f"(TF1 shards store 1..N: 1; imgcls webdataset shards: 0)"
            )
        return label


def _join(root: str, name: str) -> str:
    """ROOT/NAME. Under a pipe: root (the user's command, docs/shards.md "Object storage") NAME is appended
    to the command as one shell word, quoted: a checked name needs no quotes, and one that did stays a word."""
    if root.startswith(remote.PIPE):
        return f"{root.rstrip('/')}/{shlex.quote(name)}"
    return f"{root.rstrip('/')}/{name}" if remote.is_remote(root) else str(Path(root) / name)


def check_name(name: str, where: str) -> str:
    """`name` if it is a plain shard file name (SHARD_NAME), else a one-line DataError naming `where` it came
    from and what is allowed."""
    if not SHARD_NAME.fullmatch(name) or ".." in name:
        raise DataError(f"{redact_url(where)} names a shard {name!r}, which is not allowed; allowed: {ALLOWED_NAME}")
    return name


def _shard_url(root: str, name: str, where: str) -> str:
    """A manifest's shard name, relative to ROOT (never a URL, absolute path or pipe:CMD of its own)."""
    return _join(root, check_name(name, where))


def open_shard_set(cfg: DataSchema) -> ShardSet:
    """The ShardSet of a data config (root, format, label_base, num_classes, index_dir, shard_cache,
    storage_options), with one-line DataError/ConfigError on the user's mistakes."""
    fmt = cfg.format
    if fmt not in FORMATS:
        raise ConfigError(f"data.format={fmt} is not a shard format; allowed: {', '.join(FORMATS)}")
    root = "" if OmegaConf.is_missing(cfg, "root") or cfg.root is None else str(cfg.root)
    if not root:
        raise DataError(f"data.root is not set; pass data.root=DIR or URL of the {fmt} shards")
    label_base = str(cfg.label_base)
    if label_base not in ("auto", "0", "1"):
        raise ConfigError(f"data.label_base={label_base} is not allowed; allowed: auto, 0, 1")
    options = to_dict(cfg.storage_options, resolve=True)
    cache_dir = cfg.shard_cache
    is_url = remote.is_remote(root)
    if not is_url:
        root = str(Path(root.removeprefix("file://")).expanduser())
        if not Path(root).is_dir():
            raise DataError(f"data.root={root} does not exist or is not a directory (data.format={fmt})")

    document = _read_manifest(root, options, is_url)
    if document is not None:
        classes, stored_base, splits = _from_manifest(document, root, fmt)
    else:
        classes = _classes_without_manifest(cfg.num_classes, cfg.class_names, root)
        stored_base = DEFAULT_LABEL_BASE[fmt]
        splits = _from_names(root, fmt, options, is_url, cfg.index_dir, cache_dir)
        named = cfg.class_names is not None or len(classes) == 1000  # not "0".."N-1"
        if fmt == "tfrecord" and named and not is_url:
            base = stored_base if label_base == "auto" else int(label_base)
            _check_synset(classes, base, next(iter(splits.get("val") or splits.get("train") or []), None))
    num_classes = cfg.num_classes
    if num_classes is not None and int(num_classes) != len(classes):
        raise ConfigError(f"data.num_classes={num_classes} but {_join(root, MANIFEST)} lists {len(classes)} classes")
    return ShardSet(
        format=fmt,
        classes=classes,
        label_base=stored_base if label_base == "auto" else int(label_base),
        splits=splits,
    )


# --- with a manifest --------------------------------------------------------------------------------------


def _read_manifest(root: str, options: Any, is_url: bool) -> dict | None:
    path = _join(root, MANIFEST)
    if is_url:
        try:
            text = remote.read_text(path, options)
        except DataError as exc:
            # No manifest (then the shard names), or no access at all? A listing tells.
            try:
                names = remote.list_names(root, options)
            except DataError as list_exc:
                raise DataError(
                    f"data.root={root} has no readable {MANIFEST} ({exc}) and cannot be listed ({list_exc})"
                ) from None
            if MANIFEST in names:
                raise
            return None
    else:
        if not os.path.isfile(path):
            return None
        text = Path(path).read_text()
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(document, dict):
        raise DataError(f"{path} is not a shard manifest (a JSON object expected)")
    return document


def _from_manifest(document: dict, root: str, fmt: str) -> tuple[list[str], int, dict[str, list[Shard]]]:
    path = _join(root, MANIFEST)
    if document.get("format") != fmt:
        raise DataError(
            f"data.format={fmt} but {path} describes {document.get('format')} shards; "
            f"set data.format={document.get('format')}"
        )
    try:
        classes = [str(c) for c in document["classes"]]
        base = int(document["label_base"])
        entries = {split: document["splits"][split]["shards"] for split in SPLITS}
        splits = {
            split: [Shard(_shard_url(root, str(e["name"]), path), int(e["count"])) for e in items]
            for split, items in entries.items()
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path} is not a complete shard manifest (bad or missing {exc})") from None
    for split, shards in splits.items():
        if not shards:
            raise DataError(f"{path} lists no {split} shards")
        missing = [s.url for s in shards if not remote.is_remote(s.url) and not os.path.isfile(s.url)]
        if missing:
            raise DataError(f"{path} lists {len(missing)} {split} shard(s) that are missing, e.g. {missing[0]}")
    return classes, base, splits


# --- without a manifest (NVIDIA's TFRecords, webdataset tars from elsewhere) ------------------------------


def _classes_without_manifest(num_classes: Any, class_names: Any, root: str) -> list[str]:
    if class_names is not None:  # the records carry label numbers only: the user (or evaluate's checkpoint) names them
        names = [str(n) for n in class_names] if not isinstance(class_names, (str, bytes)) else None
        if not names:
            raise ConfigError(f"data.class_names={class_names} is not a list of class names")
        if num_classes is not None and int(num_classes) != len(names):
            raise ConfigError(f"data.class_names lists {len(names)} classes but data.num_classes={num_classes}")
        return names
    if num_classes is None:
        raise ConfigError(
            f"data.num_classes is not set and data.root={root} has no {MANIFEST} naming the classes; "
            f"set data.num_classes (1000 for ImageNet)"
        )
    if int(num_classes) == 1000:
        from imgcls.data.imagenet_classes import imagenet_names

        return list(imagenet_names())  # the sorted wnids: ImageFolder's label order, TF1's synset order
    return [str(i) for i in range(int(num_classes))]


def _check_synset(classes: list[str], label_base: int, shard: Shard | None) -> None:
    """The records carry label numbers; build_imagenet_data.py also writes each record's synset. The first record's
    synset must be the name the classes give its label, or every label would be read as another class."""
    if shard is None:
        return
    found = tfrecord.first_synset(shard.url)
    if found is None:
        return
    stored, synset = found
    index = stored - label_base
    if 0 <= index < len(classes) and classes[index] != synset:
        raise DataError(
            f"{shard.url}: its first record has label {stored}, synset {synset}, but the class names give label "
            f"{stored} (data.label_base={label_base}) the name {classes[index]} (data.class_names, the checkpoint's, "
            f"or ImageNet's sorted wnids): the records are labelled in another order"
        )


def shard_names(names: list[str], fmt: str, split: str) -> list[str]:
    """The shard files of a split among a folder's file names, sorted."""

    def is_shard(name: str) -> bool:
        if not name.startswith(PREFIXES[split]):
            return False
        if fmt == "webdataset":
            return name.endswith(".tar")
        return not name.endswith((".tar", ".idx", ".json", ".tmp"))  # TF1's names have no suffix

    return sorted(n for n in names if is_shard(n))


def _from_names(
    root: str, fmt: str, options: Any, is_url: bool, index_dir: str | None, cache_dir: str | None
) -> dict[str, list[Shard]]:
    names = remote.list_names(root, options)
    splits = {}
    for split in SPLITS:
        found = [check_name(n, f"the listing of data.root={root}") for n in shard_names(names, fmt, split)]
        if not found:
            patterns = ", ".join(p + "*" + (".tar" if fmt == "webdataset" else "") for p in PREFIXES[split])
            other = "tfrecord" if fmt == "webdataset" else "webdataset"
            hint = f" (its names fit data.format={other})" if shard_names(names, other, split) else ""
            raise DataError(f"data.root={root} has no {split} shards: looked for {patterns} (data.format={fmt}){hint}")
        splits[split] = [
            Shard(_join(root, n), _count(_join(root, n), fmt, options, is_url, index_dir, cache_dir)) for n in found
        ]
    return splits


def _count(url: str, fmt: str, options: Any, is_url: bool, index_dir: str | None, cache_dir: str | None) -> int:
    """A shard's record count: its DALI index file's line count if there is one, else a scan of its headers
    (cached in data.shard_cache, cache.count_path, valid for its path, size and mtime: an ImageNet train set
    is 1.28 M headers)."""
    if fmt == "tfrecord":
        index = tfrecord.existing_index(url, index_dir)  # a URL's own folder is never a local file: only index_dir
        if index is not None:
            return tfrecord.index_count(index)
    if is_url:
        if cache_dir is None:
            raise ConfigError(f"data.shard_cache is not set; {url} must be copied there to be counted")
        url = remote.local_copy(url, str(cache_dir), options)
    return _scanned_count(url, fmt, cache_dir)


def _scanned_count(path: str, fmt: str, cache_dir: str | None) -> int:
    stat = os.stat(path)
    key = {"path": os.path.realpath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    cached = None
    if cache_dir is not None:
        cached = cache.count_path(str(cache_dir), path)
        try:
            document = json.loads(cached.read_text())
            if {k: document.get(k) for k in key} == key:
                cache.used(cached)
                return int(document["count"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # absent, or stale from an older file: scan again
    count = len(tfrecord.scan_file(path)) if fmt == "tfrecord" else webdataset.count_samples(path)
    if cached is not None:
        text = json.dumps({**key, "count": count}) + "\n"
        try:
            cache.write_file(str(cache_dir), cached, text)
        except OSError as exc:
            raise StorageError(
                f"could not write shard count cache {cached} (data.shard_cache): {exc.strerror or type(exc).__name__}"
            ) from None
    return count


# --- writing (the converter) ------------------------------------------------------------------------------


def manifest_document(
    fmt: str, label_base: int, classes: list[str], shards: dict[str, list[tuple[str, int]]], **provenance: Any
) -> dict:
    """The manifest.json of a conversion; `shards` maps split -> [(file name, count)]."""
    return {
        "format": fmt,
        "label_base": label_base,
        "classes": list(classes),
        "splits": {
            split: {"count": sum(c for _, c in items), "shards": [{"name": n, "count": c} for n, c in items]}
            for split, items in shards.items()
        },
        **provenance,
        "created_by": "imgcls.data.shards.convert",
    }


def write_manifest(root: Path, document: dict) -> Path:
    """Written last and atomically: its presence marks a complete conversion."""
    path = Path(root) / MANIFEST
    text = json.dumps(document, indent=1) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text), what="shard manifest")
    return path
