"""Small files that declare huge contents cost bounded memory and time: 16-bit images are scaled without
whole-image float64 copies, images over PIL's pixel limit are bad images, and a TFRecord length field longer
than its file is one DataError line (torchvision reader, DALI index path), never a MemoryError."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from imgcls.data.backends import make_backend
from imgcls.data.dali.records import ShardCatalog, path_hash
from imgcls.data.images import to_rgb
from imgcls.data.protocol import LoaderSpec
from imgcls.data.shards import tfrecord
from imgcls.data.shards.convert import convert
from imgcls.data.shards.manifest import ShardSet
from imgcls.errors import DataError
from tests.conftest import ROOT, compose_config, make_image_folder, tiny_overrides

HUGE_LENGTH = 1 << 40


def write_png16(path: Path, width: int, height: int, row: Callable[[int], bytes]) -> Path:
    """A 16-bit grayscale PNG, streamed row by row (ROW(y): the row's big-endian samples): a file that declares
    a large image without the test holding it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer = zlib.compressobj(9)
    idat = b"".join(packer.compress(b"\0" + row(y)) for y in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 16, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return path


def load_in_a_fresh_process(path: Path) -> dict:
    """load_rgb(PATH) in a new process: its verdict, and how far it raised the process's peak resident memory."""
    script = """
import json, resource, sys
from imgcls.data.bad_images import BadImage
from imgcls.data.images import load_rgb
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    verdict = list(load_rgb(sys.argv[1]).size)
except BadImage as exc:
    verdict = str(exc)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"verdict": verdict, "grown_bytes": grown * 1024}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


# --- 16-bit images ------------------------------------------------------------------------------------------
def test_16bit_png_is_scaled_without_float64_copies(tmp_path: Path) -> None:
    """4000x4000 at 16 bits is 32 MB of samples. Whole-image float64 arrays (8 bytes a pixel, three at once)
    raised the peak by ~12x that; the decoded image, its 8-bit copy and the RGB result need ~4x."""
    side = 4000
    ramp = np.arange(side, dtype=np.uint32)
    path = write_png16(
        tmp_path / "ramp16.png", side, side, lambda y: ((ramp + y) * 65535 // (2 * side)).astype(">u2").tobytes()
    )
    result = load_in_a_fresh_process(path)
    assert result["verdict"] == [side, side]
    assert result["grown_bytes"] < 6 * side * side * 2, result


def test_16bit_values_are_rounded_to_the_nearest_8bit_value() -> None:
    """Every 16-bit value v becomes round(v * 255 / 65535), as the float64 formula gave: exact integers now."""
    values = np.arange(65536, dtype=np.uint16).reshape(256, 256)
    expected = np.floor(values.astype(np.float64) * 255 / 65535 + 0.5).astype(np.uint8)
    for mode, dtype in (("I;16", "<u2"), ("I;16B", ">u2")):
        image = Image.frombytes(mode, (256, 256), values.astype(dtype).tobytes())
        assert np.array_equal(np.asarray(to_rgb(image)), np.repeat(expected[..., None], 3, axis=2)), mode
    # 32-bit integer images (mode I): scaled from 16 bits when a value is above 255, else taken as 8-bit values.
    wide = Image.fromarray(values.astype(np.int32) * 2 - 1000)
    clipped = np.floor(np.clip(values.astype(np.float64) * 2 - 1000, 0, 65535) * 255 / 65535 + 0.5)
    assert np.array_equal(np.asarray(to_rgb(wide))[..., 0], clipped.astype(np.uint8))
    narrow = Image.fromarray((values % 256).astype(np.int32) - 5)
    assert np.array_equal(np.asarray(to_rgb(narrow))[..., 0], np.clip((values % 256).astype(int) - 5, 0, 255))


def test_a_small_png_declaring_144_megapixels_is_a_bad_image_at_no_cost(tmp_path: Path) -> None:
    """The report's file: a ~280 KB 16-bit PNG of 12000x12000 zeros cost +3.6 GB and 10 s to decode. It is over
    PIL's own pixel limit (89.5 MP): a bad image, found from its header."""
    path = write_png16(tmp_path / "bomb16.png", 12000, 12000, lambda y: bytes(24000))
    assert path.stat().st_size < 1 << 20
    result = load_in_a_fresh_process(path)
    assert "144000000 pixels" in result["verdict"] and "89478485" in result["verdict"], result
    assert result["grown_bytes"] < 50 << 20, result


# --- TFRecord length fields ---------------------------------------------------------------------------------
def framed(length: int, data: bytes) -> bytes:
    """One TFRecord record whose length field says LENGTH (its checksum valid) over DATA."""
    field = struct.pack("<Q", length)
    return field + struct.pack("<I", tfrecord.masked_crc(field)) + data + struct.pack("<I", tfrecord.masked_crc(data))


def assert_names_the_length(error: DataError, path: Path | str, offset: int) -> None:
    message = str(error)
    assert "\n" not in message and str(path) in message, message
    assert f"at byte {offset}" in message and f"length {HUGE_LENGTH}" in message, message


def test_a_huge_length_field_is_one_line_in_every_reader(tmp_path: Path) -> None:
    good = framed(5, b"hello")
    first = tmp_path / "first"
    first.write_bytes(framed(HUGE_LENGTH, b"x" * 64))
    second = tmp_path / "second"
    second.write_bytes(good + framed(HUGE_LENGTH, b"x" * 64))
    with pytest.raises(DataError) as info:
        tfrecord.first_synset(first)  # read the length's worth of bytes: a MemoryError
    assert_names_the_length(info.value, first, 0)
    for path, offset in ((first, 0), (second, len(good))):
        with pytest.raises(DataError) as info:
            tfrecord.scan_file(path)
        assert_names_the_length(info.value, path, offset)
        with pytest.raises(DataError) as info:
            list(tfrecord.iter_records(path.read_bytes(), str(path)))
        assert_names_the_length(info.value, path, offset)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two classes in TFRecord shards with DALI index files; val's class_1/001.jpg truncated (a bad image)."""
    folder = make_image_folder(tmp_path_factory.mktemp("folder"), classes=2, train_per_class=4, val_per_class=3)
    bad = folder / "val" / "class_1" / "001.jpg"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    out = tmp_path_factory.mktemp("shards") / "tf"
    convert(folder, out, "tfrecord", 3, seed=0, progress=False)
    return out


def with_huge_length(root: Path, name: str | None = None) -> tuple[Path, int]:
    """Give a record of ROOT's val shards (the one whose image/filename is NAME, else the first shard's first) a
    length field of HUGE_LENGTH; the file's size and its index file stay as they are. (path, the record's offset)."""
    for path in sorted(root.glob("validation-*")):
        data = bytearray(path.read_bytes())
        records = tfrecord.iter_records(bytes(data), str(path))
        for (offset, _), record in zip(tfrecord.scan_file(path), records, strict=True):
            if name is None or tfrecord.decode_example(record)[2] == name:
                data[offset : offset + 12] = framed(HUGE_LENGTH, b"")[:12]
                path.write_bytes(bytes(data))
                return path, offset
    raise AssertionError(f"no val record named {name}")


@pytest.mark.parametrize("backend", ["torchvision", "dali_cpu"])
def test_shards_with_a_huge_length_field_are_one_line(converted: Path, tmp_path: Path, backend: str) -> None:
    """Without a manifest, named classes make the shard set read the first record's synset before any loader
    (dali_cpu: the shards' DALI index files are there, so nothing else reads the headers)."""
    if backend == "dali_cpu":
        pytest.importorskip("nvidia.dali")
    root = tmp_path / "tf"
    shutil.copytree(converted, root)
    (root / "manifest.json").unlink()
    path, offset = with_huge_length(root)
    named = ["data.num_classes=2", "data.class_names=[class_0,class_1]"]
    overrides = tiny_overrides(
        root, "data.format=tfrecord", f"data.backend={backend}", f"data.shard_cache={tmp_path / 'cache'}", *named
    )
    with pytest.raises(DataError) as info:
        make_backend(compose_config(overrides).data).loader(LoaderSpec("val", 2))
    assert_names_the_length(info.value, path, offset)


def test_dali_reading_a_huge_length_field_is_one_line(converted: Path, tmp_path: Path) -> None:
    """With a manifest and index files, DALI reads the record itself and checks the length against the index."""
    pytest.importorskip("nvidia.dali")
    root = tmp_path / "tf"
    shutil.copytree(converted, root)
    path, _ = with_huge_length(root, "class_1/001.jpg")
    overrides = tiny_overrides(root, "data.format=tfrecord", "data.backend=dali_cpu", f"data.shard_cache={tmp_path}")
    with pytest.raises(DataError, match=f"^DALI could not read the data: .*{path}.*{HUGE_LENGTH}") as info:
        for _ in make_backend(compose_config(overrides).data).loader(LoaderSpec("val", 2)):
            pass
    assert "\n" not in str(info.value)


def test_naming_a_bad_record_checks_its_length_before_reading_it(tmp_path: Path) -> None:
    """ShardCatalog reads a bad record again for its name: a length field (or tar member size) past the file's
    end is one DataError, not a read of that many bytes."""
    record = tmp_path / "records"
    record.write_bytes(framed(5, b"hello") + framed(HUGE_LENGTH, b"x" * 64))
    tar = tmp_path / "records.tar"
    member = tarfile.TarInfo("class_0/000.jpg")
    member.size = HUGE_LENGTH
    tar.write_bytes(member.tobuf(format=tarfile.GNU_FORMAT) + bytes(1024))
    for fmt, path, offset, needle in (("tfrecord", record, 21, f"length {HUGE_LENGTH}"),
                                      ("webdataset", tar, 512, f"size {HUGE_LENGTH}")):  # fmt: skip
        catalog = ShardCatalog(ShardSet(fmt, ["class_0"], 0, {"val": []}), "val", [str(path)])
        with pytest.raises(DataError) as info:
            catalog.bad_samples(torch.tensor([[path_hash(str(path)), offset, 0]]))
        message = str(info.value)
        assert "\n" not in message and str(path) in message and f"at byte {offset}" in message and needle in message
