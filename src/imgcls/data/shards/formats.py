"""The shard formats' common reader: a whole shard file's bytes -> (image bytes, stored label, record name)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from imgcls.data.shards import tfrecord, webdataset
from imgcls.errors import ConfigError

FORMATS = ("webdataset", "tfrecord")


def check_format(fmt: str, key: str = "data.format") -> str:
    if fmt not in FORMATS:
        raise ConfigError(f"{key}={fmt} is not a shard format; allowed: {', '.join(FORMATS)}")
    return fmt


def read_records(fmt: str, data: bytes, name: str = "") -> Iterator[tuple[bytes, int, str]]:
    """(encoded image, STORED label, record name) of each record of one shard file, in file order. The record
    name is the source's relative path when the shard holds it (tfrecord image/filename, webdataset key),
    else "#<record number>". `name` (the shard's path or URL) prefixes error messages."""
    for image, label, record_name, _ in read_boxed_records(fmt, data, name):
        yield image, label, record_name


def read_boxed_records(fmt: str, data: bytes, name: str = "") -> Iterator[tuple[bytes, int, str, np.ndarray | None]]:
    """read_records' records with their object boxes (tfrecord's image/object/bbox/*, TF1's crop: (K, 4) rows
    ymin, xmin, ymax, xmax relative to the image), None where a record or the format has none."""
    if check_format(fmt) == "webdataset":
        for image, label, key in webdataset.iter_samples(data, name):
            yield image, label, key, None
        return
    for number, record in enumerate(tfrecord.iter_records(data, name)):
        image, label, filename, boxes = tfrecord.decode_example(record, f"{name}: record {number}")
        yield image, label, filename if filename is not None else f"#{number}", boxes
