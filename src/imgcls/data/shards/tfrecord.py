"""TFRecord files of tf.train.Example records (the TF seeds' ImageNet shards) and their DALI index files.

Framing (TensorFlow's record_writer.cc): uint64 length, masked crc32c of the length, the data, masked crc32c
of the data, all little-endian. TensorFlow is not its only reader: DALI's fn.readers.tfrecord reads it (the
DALI backend does, with the index files made below), and small PyPI packages (tfrecord, tfrecords) read and
write it. None serves here: DALI reads only inside its pipeline and writes nothing, TensorFlow is a multi-GiB
dependency, and another package would be one more dependency for 20 lines. So the framing is written here,
its checksums (google-crc32c's) verified on every read.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import google_crc32c
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from imgcls.data.shards import cache
from imgcls.errors import DataError
from imgcls.storage import write_atomic

IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
FILENAME_KEY = "image/filename"
SYNSET_KEY = "image/class/synset"
# The object boxes of TF1 build_imagenet_data.py, one float list per coordinate, relative to the image (what
# TF1 reads for its crop, TF1/utils/image_processing.py:33-43), in sample_distorted_bounding_box's order.
BOX_KEYS = ("image/object/bbox/ymin", "image/object/bbox/xmin", "image/object/bbox/ymax", "image/object/bbox/xmax")
_HEADER = struct.Struct("<QI")  # length, masked crc of the length
_FOOTER = struct.Struct("<I")  # masked crc of the data
_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    """TensorFlow's masked crc32c (crc32c.h Mask): rotate right by 15 and add a constant."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# --- tf.train.Example -------------------------------------------------------------------------------------


@functools.cache
def _example_class() -> Any:
    """The message classes of tensorflow/core/example/{feature,example}.proto, built from a descriptor written
    here: the same wire format as TensorFlow's generated code without depending on tensorflow (or on a
    generated _pb2 file that pins a protobuf version). Field numbers and types are those of the .proto files."""
    T = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="imgcls/tf_example.proto", package="tensorflow", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str | None]) -> descriptor_pb2.DescriptorProto:
        msg = proto.message_type.add(name=name)
        for field_name, number, type_, label, type_name in fields:
            f = msg.field.add(name=field_name, number=number, type=type_, label=label)
            if type_name:
                f.type_name = type_name
        return msg

    rep, opt = T.LABEL_REPEATED, T.LABEL_OPTIONAL
    message("BytesList", ("value", 1, T.TYPE_BYTES, rep, None))
    message("FloatList", ("value", 1, T.TYPE_FLOAT, rep, None))
    message("Int64List", ("value", 1, T.TYPE_INT64, rep, None))
    feature = message(
        "Feature",
        ("bytes_list", 1, T.TYPE_MESSAGE, opt, ".tensorflow.BytesList"),
        ("float_list", 2, T.TYPE_MESSAGE, opt, ".tensorflow.FloatList"),
        ("int64_list", 3, T.TYPE_MESSAGE, opt, ".tensorflow.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    features = message("Features", ("feature", 1, T.TYPE_MESSAGE, rep, ".tensorflow.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")  # proto3 `map<string, Feature>` is this nested type
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=T.TYPE_STRING, label=opt)
    entry.field.add(name="value", number=2, type=T.TYPE_MESSAGE, label=opt, type_name=".tensorflow.Feature")
    message("Example", ("features", 1, T.TYPE_MESSAGE, opt, ".tensorflow.Features"))

    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    file = pool.FindFileByName(proto.name)
    return message_factory.GetMessageClass(file.message_types_by_name["Example"])


def encode_example(
    image: bytes,
    label: int,
    filename: str | None = None,
    synset: str | None = None,
    boxes: list[tuple[float, float, float, float]] | None = None,
) -> bytes:
    """A serialized tf.train.Example with TF1 build_imagenet_data.py's features that the readers use
    (image/encoded, image/class/label, image/filename, image/class/synset, the object boxes (ymin, xmin, ymax,
    xmax) relative to the image); deterministic bytes (map keys sorted). The box lists are always there, empty
    without boxes, as build_imagenet_data.py writes them: DALI's reader gives a missing list as a scalar and
    cannot batch records with and without them."""
    example = _example_class()()
    feature = example.features.feature
    feature[IMAGE_KEY].bytes_list.value.append(image)
    feature[LABEL_KEY].int64_list.value.append(int(label))
    if filename is not None:
        feature[FILENAME_KEY].bytes_list.value.append(filename.encode())
    if synset is not None:
        feature[SYNSET_KEY].bytes_list.value.append(synset.encode())
    for key in BOX_KEYS:
        feature[key].float_list.SetInParent()
    for box in boxes or ():
        for key, value in zip(BOX_KEYS, box):
            feature[key].float_list.value.append(float(value))
    return example.SerializeToString(deterministic=True)


def decode_example(data: bytes, where: str = "") -> tuple[bytes, int, str | None, np.ndarray | None]:
    """(image bytes, stored label, image/filename or None, object boxes or None) of a serialized
    tf.train.Example. The boxes: (K, 4) float32 rows (ymin, xmin, ymax, xmax) relative to the image (BOX_KEYS;
    coordinate lists of unequal lengths are cut to the shortest); None where the record has none."""
    example = _example_class()()
    try:
        example.ParseFromString(data)
    except DecodeError:
        raise DataError(f"{where}: not a tf.train.Example") from None
    feature = example.features.feature
    if IMAGE_KEY not in feature or not feature[IMAGE_KEY].bytes_list.value:
        raise DataError(f"{where}: the tf.train.Example has no '{IMAGE_KEY}' bytes feature")
    if LABEL_KEY not in feature or not feature[LABEL_KEY].int64_list.value:
        raise DataError(f"{where}: the tf.train.Example has no '{LABEL_KEY}' int64 feature")
    name = None
    if FILENAME_KEY in feature and feature[FILENAME_KEY].bytes_list.value:
        name = feature[FILENAME_KEY].bytes_list.value[0].decode(errors="replace")
    boxes = None
    if all(key in feature for key in BOX_KEYS):
        sides = [feature[key].float_list.value for key in BOX_KEYS]
        count = min(len(side) for side in sides)
        if count:
            boxes = np.array([list(side[:count]) for side in sides], np.float32).T
    return feature[IMAGE_KEY].bytes_list.value[0], int(feature[LABEL_KEY].int64_list.value[0]), name, boxes


# --- framing ----------------------------------------------------------------------------------------------


def write_record(out: BinaryIO, data: bytes) -> int:
    """Append one framed record; returns the bytes written (the DALI index's record length)."""
    length = struct.pack("<Q", len(data))
    out.write(length + struct.pack("<I", masked_crc(length)) + data + _FOOTER.pack(masked_crc(data)))
    return _HEADER.size + len(data) + _FOOTER.size


def check_length(where: str | Path, number: int | None, offset: int, length: int, size: int) -> None:
    """A record's length field against the SIZE bytes of its file, before anything of that length is read or
    allocated: a corrupt (or crafted) length of 2^40 would otherwise be a 1 TiB read, a MemoryError."""
    left = size - offset - _HEADER.size - _FOOTER.size
    if length > left:
        record = f"record {number} at byte {offset}" if number is not None else f"the record at byte {offset}"
        raise DataError(
            f"{where}: truncated or corrupt TFRecord ({record} has length {length}, "
            f"more than the {max(left, 0)} bytes the file has after its framing)"
        )


def iter_records(data: bytes, where: str = "") -> Iterator[bytes]:
    """The records of a whole TFRecord file in memory, checksums verified (a truncated or corrupt shard is
    one DataError naming the record and offset, not a protobuf error later)."""
    view = memoryview(data)
    offset, number = 0, 0
    while offset < len(data):
        if offset + _HEADER.size > len(data):
            raise DataError(f"{where}: truncated TFRecord (record {number} at byte {offset} has no full header)")
        length, length_crc = _HEADER.unpack_from(data, offset)
        if masked_crc(data[offset : offset + 8]) != length_crc:
            raise DataError(
                f"{where}: not a TFRecord file or corrupt (bad length checksum of record {number} at byte {offset})"
            )
        check_length(where, number, offset, length, len(data))
        start = offset + _HEADER.size
        end = start + length
        record = bytes(view[start:end])
        if masked_crc(record) != _FOOTER.unpack_from(data, end)[0]:
            raise DataError(f"{where}: corrupt TFRecord (bad data checksum of record {number} at byte {offset})")
        yield record
        offset, number = end + _FOOTER.size, number + 1


def first_synset(path: str | Path) -> tuple[int, str] | None:
    """(stored label, image/class/synset) of a TFRecord file's first record, or None when it has none
    (build_imagenet_data.py and imgcls's converter write the synset; other writers may not)."""
    with open(path, "rb") as f:
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        length = _HEADER.unpack(header)[0]
        check_length(path, 0, 0, length, os.fstat(f.fileno()).st_size)
        data = f.read(length)
    example = _example_class()()
    try:
        example.ParseFromString(data)
    except DecodeError:
        return None  # the readers name a corrupt record when they reach it
    feature = example.features.feature
    if not feature[SYNSET_KEY].bytes_list.value or not feature[LABEL_KEY].int64_list.value:
        return None
    return int(feature[LABEL_KEY].int64_list.value[0]), feature[SYNSET_KEY].bytes_list.value[0].decode(errors="replace")


def scan_file(path: str | Path) -> list[tuple[int, int]]:
    """(offset, length) of each record of a TFRecord file, reading only the 12-byte headers (seeking past the
    data): the DALI index and the record count of a shard without reading it."""
    spans: list[tuple[int, int]] = []
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        offset = 0
        while offset < size:
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                raise DataError(f"{path}: truncated TFRecord (record {len(spans)} at byte {offset})")
            length, length_crc = _HEADER.unpack(header)
            if masked_crc(header[:8]) != length_crc:
                raise DataError(f"{path}: not a TFRecord file or corrupt (bad length checksum at byte {offset})")
            check_length(path, len(spans), offset, length, size)
            total = _HEADER.size + length + _FOOTER.size
            spans.append((offset, total))
            offset += total
            f.seek(offset)
    return spans


# --- DALI index files -------------------------------------------------------------------------------------


def index_text(spans: list[tuple[int, int]]) -> str:
    """DALI's tfrecord2idx format (its bin/tfrecord2idx script): one "offset length" line per record, the
    length including the 16 bytes of framing."""
    return "".join(f"{offset} {length}\n" for offset, length in spans)


def existing_index(path: str, index_dir: str | None) -> Path | None:
    """The user's DALI index file of the TFRecord file PATH, if any: INDEX_DIR/NAME.idx (NVIDIA --data_idx_dir),
    else SHARD_DIR/dali_idx/NAME.idx, else SHARD_DIR/../dali_idx/NAME.idx (NVIDIA's TF1 layout:
    ${DATA_DIR}/tfrecords beside ${DATA_DIR}/dali_idx, as made by TF1/utils/dali_index.sh)."""
    name = f"{os.path.basename(path)}.idx"
    shard_dir = Path(path).parent
    candidates = [Path(index_dir) / name] if index_dir else []
    candidates += [shard_dir / "dali_idx" / name, shard_dir.parent / "dali_idx" / name]
    return next((c for c in candidates if c.is_file()), None)


def dali_index_files(local_paths: list[str], index_dir: str | None, cache_dir: str) -> list[str]:
    """The DALI index file of each local TFRecord file: the user's (existing_index), else one made once
    (atomically: ranks racing write the same bytes) in CACHE_DIR (cache.index_path: keyed by the shard's
    path, size and mtime). Never written into the user's data folder."""
    found = []
    for path in local_paths:
        existing = existing_index(path, index_dir)
        if existing is None:
            existing = cache.index_path(cache_dir, path, os.stat(path))
            if existing.is_file():
                cache.used(existing)
            else:
                text = index_text(scan_file(path))
                write_atomic(existing, functools.partial(Path.write_text, data=text), what="DALI index file")
        found.append(str(existing))
    return found


def index_count(path: str | Path) -> int:
    """The number of records a DALI index file lists."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())
