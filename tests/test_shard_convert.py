"""Shard formats, manifest and converter (docs/shards.md): an ImageFolder converted to TFRecord and WebDataset
shards holds exactly its files and ImageFolder's labels, byte for byte, deterministically; DALI's own readers
read our shards with our index files; a folder of shards without a manifest (NVIDIA's TF1 layout) opens with
counts from DALI index files or a header scan; every user mistake is one line."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

from imgcls.config.schema import DataSchema
from imgcls.data.shards import manifest, tfrecord, webdataset
from imgcls.data.shards.__main__ import main as shards_main
from imgcls.data.shards.convert import convert
from imgcls.data.shards.formats import read_records
from imgcls.data.shards.manifest import ShardSet
from imgcls.errors import ConfigError, DataError
from imgcls.typed_config import settings
from tests.conftest import make_image_folder

FORMATS = ("webdataset", "tfrecord")
SHARD_SIZE = 7


def open_shard_set(cfg: dict) -> ShardSet:
    """The test's data keys over the data schema's defaults, as a composed data config has them."""
    return manifest.open_shard_set(settings(DataSchema, cfg))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_image_folder(tmp_path_factory.mktemp("folder"), classes=3, train_per_class=8, val_per_class=4)
    # A dotted stem (the webdataset key must not split there) and a nested folder (ImageFolder walks it;
    # the key holds two '/').
    shutil.copy(root / "train/class_1/000.jpg", root / "train/class_1/a.b.c.jpg")
    (root / "train/class_2/sub").mkdir()
    Image.new("RGB", (48, 40), (10, 20, 200)).save(root / "train/class_2/sub/x.jpeg")
    return root


@pytest.fixture(scope="module")
def converted(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("shards")
    return {fmt: convert(folder, out / fmt, fmt, SHARD_SIZE, progress=False).parent for fmt in FORMATS}


def folder_samples(folder: Path, split: str) -> list[tuple[str, bytes, int]]:
    """(relative path, bytes, label) in ImageFolder's order, with ImageFolder's labels."""
    dataset = ImageFolder(str(folder / split))
    return [(Path(p).relative_to(folder / split).as_posix(), Path(p).read_bytes(), y) for p, y in dataset.samples]


def shard_records(root: Path, split: str) -> list[tuple[str, bytes, int]]:
    manifest = json.loads((root / "manifest.json").read_text())
    out = []
    for shard in manifest["splits"][split]["shards"]:
        data = (root / shard["name"]).read_bytes()
        records = list(read_records(manifest["format"], data, shard["name"]))
        assert len(records) == shard["count"]
        out += [(name, image, label - manifest["label_base"]) for image, label, name in records]
    return out


def record_name(fmt: str, relative: str) -> str:
    return webdataset.key_of(relative) if fmt == "webdataset" else relative


# --- conversion --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_manifest_lists_the_classes_counts_and_shards(folder: Path, converted: dict[str, Path], fmt: str) -> None:
    root = converted[fmt]
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["format"] == fmt
    assert manifest["label_base"] == (1 if fmt == "tfrecord" else 0)
    assert manifest["classes"] == ["class_0", "class_1", "class_2"]
    suffix = ".tar" if fmt == "webdataset" else ""
    for split, prefix, count, shards in (("train", "train", 26, 4), ("val", "validation", 12, 2)):
        entry = manifest["splits"][split]
        assert entry["count"] == count == len(folder_samples(folder, split))
        names = [f"{prefix}-{i:05d}-of-{shards:05d}{suffix}" for i in range(shards)]
        assert [s["name"] for s in entry["shards"]] == names
        sizes = [s["count"] for s in entry["shards"]]
        assert sum(sizes) == count and max(sizes) - min(sizes) <= 1 and max(sizes) <= SHARD_SIZE
    expected = {"manifest.json"} | {s["name"] for e in manifest["splits"].values() for s in e["shards"]}
    assert {p.name for p in root.iterdir() if p.is_file()} == expected  # no temp file left behind
    if fmt == "tfrecord":
        assert sorted(p.name for p in (root / "dali_idx").iterdir()) == sorted(
            f"{n}.idx" for n in expected - {"manifest.json"}
        )
    shard_set = open_shard_set({"root": str(root), "format": fmt})
    assert shard_set.classes == manifest["classes"] and shard_set.label_base == manifest["label_base"]
    assert shard_set.count("train") == 26 and shard_set.count("val") == 12
    assert shard_set.splits["val"][1].url == str(root / f"validation-00001-of-00002{suffix}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_shards_hold_exactly_the_folders_files_with_imagefolders_labels(
    folder: Path, converted: dict[str, Path], fmt: str
) -> None:
    for split in ("train", "val"):
        expected = [(record_name(fmt, rel), data, label) for rel, data, label in folder_samples(folder, split)]
        got = shard_records(converted[fmt], split)
        assert sorted(got) == sorted(expected)
        if split == "val":
            assert got == expected  # validation keeps the folder's order
        else:  # train is shuffled before sharding: a shard is not one class
            assert got != expected
            assert all(len({label for _, _, label in got[i : i + SHARD_SIZE]}) > 1 for i in (0, SHARD_SIZE))
    if fmt == "webdataset":
        names = {name for name, _, _ in shard_records(converted[fmt], "train")}
        assert {"class_1/a_b_c", "class_2/sub/x"} <= names


def test_conversion_is_deterministic(folder: Path, converted: dict[str, Path], tmp_path: Path) -> None:
    for fmt in FORMATS:
        again = convert(folder, tmp_path / fmt, fmt, SHARD_SIZE, progress=False).parent
        files = sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(converted[fmt]) for p in converted[fmt].rglob("*") if p.is_file())
        for name in files:
            assert (again / name).read_bytes() == (converted[fmt] / name).read_bytes(), name
    other = convert(folder, tmp_path / "seed1", "webdataset", SHARD_SIZE, seed=1, progress=False).parent
    for name, same in (("train-00000-of-00004.tar", False), ("validation-00000-of-00002.tar", True)):
        assert ((other / name).read_bytes() == (converted["webdataset"] / name).read_bytes()) is same


# --- DALI's own readers on our shards (interop) ------------------------------------------------------------


def _run_dali(reader, count: int) -> list[tuple[bytes, np.ndarray]]:
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=count, num_threads=1, device_id=None, seed=0)
    def pipe():
        return tuple(reader())

    pipeline = pipe()
    pipeline.build()
    images, labels = pipeline.run()
    return [(np.array(images.at(i)).tobytes(), np.array(labels.at(i))) for i in range(count)]


def test_dalis_tfrecord_reader_reads_our_tfrecords_with_our_index_files(
    converted: dict[str, Path], tmp_path: Path
) -> None:
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec

    root = converted["tfrecord"]
    shard_set = open_shard_set({"root": str(root), "format": "tfrecord"})
    paths = [s.url for s in shard_set.splits["train"]]
    index = tfrecord.dali_index_files(paths, None, str(tmp_path / "cache"))
    assert index == [str(root / "dali_idx" / f"{os.path.basename(p)}.idx") for p in paths]
    assert not (tmp_path / "cache").exists()  # the converter's index files are used, none made

    features = {
        "image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
        "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1),
    }

    def reader():
        out = fn.readers.tfrecord(path=paths, index_path=index, features=features)
        return out["image/encoded"], out["image/class/label"]

    got = sorted((image, int(label[0])) for image, label in _run_dali(reader, shard_set.count("train")))
    ours = []
    for path in paths:
        ours += [(image, label) for image, label, _ in read_records("tfrecord", Path(path).read_bytes())]
    assert got == sorted(ours)
    assert {label for _, label in got} == {1, 2, 3}  # stored 1-based, as TF1


def test_index_files_are_made_once_in_the_cache_never_in_the_data_folder(
    converted: dict[str, Path], tmp_path: Path
) -> None:
    bare = tmp_path / "bare"  # NVIDIA-style TFRecords without index files
    bare.mkdir()
    names = sorted(n for n in os.listdir(converted["tfrecord"]) if n.startswith("train-"))
    for name in names:
        shutil.copy(converted["tfrecord"] / name, bare / name)
    paths = sorted(str(bare / n) for n in names)
    made = tfrecord.dali_index_files(paths, None, str(tmp_path / "cache"))
    assert all(p.startswith(str(tmp_path / "cache" / "dali_idx")) for p in made)
    assert sorted(os.listdir(bare)) == sorted(names)  # nothing written next to the user's shards
    for path, index in zip(paths, made):
        ours = converted["tfrecord"] / "dali_idx" / f"{os.path.basename(path)}.idx"
        assert Path(index).read_text() == ours.read_text()  # the same "offset length" lines as tfrecord2idx
    mtimes = [os.stat(p).st_mtime_ns for p in made]
    assert tfrecord.dali_index_files(paths, None, str(tmp_path / "cache")) == made
    assert [os.stat(p).st_mtime_ns for p in made] == mtimes  # made once, reused
    user_index = tmp_path / "idx"
    user_index.mkdir()
    (user_index / f"{names[0]}.idx").write_text(Path(made[0]).read_text())
    assert tfrecord.dali_index_files(paths[:1], str(user_index), str(tmp_path / "c2")) == [
        str(user_index / f"{os.path.basename(paths[0])}.idx")
    ]


def test_dalis_webdataset_reader_reads_our_tars(converted: dict[str, Path]) -> None:
    import nvidia.dali.fn as fn

    shard_set = open_shard_set({"root": str(converted["webdataset"]), "format": "webdataset"})
    paths = [s.url for s in shard_set.splits["train"]]

    def reader():
        image, label = fn.readers.webdataset(paths=paths, ext=["jpg", "cls"], missing_component_behavior="error")
        return image, label

    got = sorted((image, int(label.tobytes())) for image, label in _run_dali(reader, shard_set.count("train")))
    ours = []
    for path in paths:
        ours += [(image, label) for image, label, _ in read_records("webdataset", Path(path).read_bytes())]
    assert got == sorted(ours)
    assert {label for _, label in got} == {0, 1, 2}


# --- a folder of shards without a manifest ----------------------------------------------------------------


def _copy_without_manifest(src: Path, dst: Path, with_index: bool) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("manifest.json", *(() if with_index else ("dali_idx",))))
    return dst


def test_tf1_folder_with_dali_index_files_opens_without_a_manifest(converted: dict[str, Path], tmp_path: Path) -> None:
    root = _copy_without_manifest(converted["tfrecord"], tmp_path / "tf1", with_index=True)
    cfg = {"root": str(root), "format": "tfrecord", "num_classes": 3, "shard_cache": str(tmp_path / "cache")}
    shard_set = open_shard_set(cfg)
    assert shard_set.label_base == 1 and shard_set.classes == ["0", "1", "2"]
    assert shard_set.count("train") == 26 and shard_set.count("val") == 12
    assert [Path(s.url).name for s in shard_set.splits["val"]] == [f"validation-0000{i}-of-00002" for i in (0, 1)]
    assert not (tmp_path / "cache").exists()  # counted from the index files, no scan
    assert open_shard_set({**cfg, "label_base": 0}).label_base == 0
    # 1000 classes are named by ImageNet's sorted wnids; these records carry their own synsets (class_0, ...), so the
    # first record's synset refuses that naming (build_imagenet_data.py's records carry the wnids and pass).
    with pytest.raises(DataError, match="synset class_0, but the class names give label 1 .* the name n01440764"):
        open_shard_set({**cfg, "num_classes": 1000})
    named = open_shard_set({**cfg, "num_classes": 3, "class_names": ["class_0", "class_1", "class_2"]})
    assert named.classes == ["class_0", "class_1", "class_2"]


def test_nvidia_layout_tfrecords_beside_dali_idx(converted: dict[str, Path], tmp_path: Path) -> None:
    """NVIDIA's TF1 layout: --data_dir=${DATA_DIR}/tfrecords --data_idx_dir=${DATA_DIR}/dali_idx, siblings. The
    index files are found there without data.index_dir: counted from them, and DALI is given them (no scan)."""
    data_dir = tmp_path / "DATA_DIR"
    root = _copy_without_manifest(converted["tfrecord"], data_dir / "tfrecords", with_index=False)
    shutil.copytree(converted["tfrecord"] / "dali_idx", data_dir / "dali_idx")
    cfg = {"root": str(root), "format": "tfrecord", "num_classes": 3, "shard_cache": str(tmp_path / "cache")}
    shard_set = open_shard_set(cfg)
    assert shard_set.count("train") == 26 and shard_set.count("val") == 12
    paths = [s.url for s in shard_set.splits["train"]]
    assert tfrecord.dali_index_files(paths, None, str(tmp_path / "cache")) == [
        str(data_dir / "dali_idx" / f"{os.path.basename(p)}.idx") for p in paths
    ]
    assert not (tmp_path / "cache").exists()  # neither counting nor DALI's index needed a scan


@pytest.mark.parametrize("fmt", FORMATS)
def test_shards_without_index_files_are_counted_by_a_cached_scan(
    converted: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    root = _copy_without_manifest(converted[fmt], tmp_path / "bare", with_index=False)
    os.rename(
        root / "validation-00000-of-00002" if fmt == "tfrecord" else root / "validation-00000-of-00002.tar",
        root / ("val-00000-of-00002" + (".tar" if fmt == "webdataset" else "")),
    )  # val-* is accepted too
    cfg = {"root": str(root), "format": fmt, "num_classes": 3, "shard_cache": str(tmp_path / "cache")}
    shard_set = open_shard_set(cfg)
    assert shard_set.label_base == (1 if fmt == "tfrecord" else 0)
    assert [s.count for s in shard_set.splits["train"]] == [6, 7, 6, 7]
    assert shard_set.count("val") == 12
    cached = sorted((tmp_path / "cache" / "counts").iterdir())
    assert len(cached) == 6
    # The cache is keyed by size and mtime: a shard that grew by a record is counted again.
    first = Path(shard_set.splits["train"][0].url)
    records = list(read_records(fmt, first.read_bytes()))
    first.write_bytes(write_shard(fmt, records + records[:1]))
    assert open_shard_set(cfg).splits["train"][0].count == 7


def write_shard(fmt: str, records: list[tuple[bytes, int, str]]) -> bytes:
    buffer = io.BytesIO()
    if fmt == "tfrecord":
        for image, label, name in records:
            tfrecord.write_record(buffer, tfrecord.encode_example(image, label, name))
        return buffer.getvalue()
    writer = webdataset.ShardWriter(buffer)
    for image, label, key in records:
        writer.write(key, image, label)
    writer.close()
    return buffer.getvalue()


# --- one-line errors --------------------------------------------------------------------------------------


def test_open_shard_set_mistakes_are_one_line(converted: dict[str, Path], tmp_path: Path) -> None:
    def error(cfg: dict, kind: type = DataError) -> str:
        with pytest.raises(kind) as info:
            open_shard_set(cfg)
        assert "\n" not in str(info.value)
        return str(info.value)

    tf = {"root": str(converted["tfrecord"]), "format": "tfrecord"}
    assert "does not exist" in error({**tf, "root": str(tmp_path / "nope")})
    assert "data.label_base=2" in error({**tf, "label_base": 2}, ConfigError)
    assert "set data.format=tfrecord" in error({**tf, "format": "webdataset"})
    assert "data.num_classes=5" in error({**tf, "num_classes": 5}, ConfigError)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "data.num_classes is not set" in error({"root": str(empty), "format": "tfrecord"}, ConfigError)
    message = error({"root": str(empty), "format": "webdataset", "num_classes": 3})
    assert "no train shards" in message and "train-*.tar" in message
    bare = _copy_without_manifest(converted["tfrecord"], tmp_path / "tf", with_index=True)
    assert "fit data.format=tfrecord" in error({"root": str(bare), "format": "webdataset", "num_classes": 3})
    shutil.copytree(converted["webdataset"], tmp_path / "partial")
    os.remove(tmp_path / "partial" / "train-00002-of-00004.tar")
    assert "missing" in error({"root": str(tmp_path / "partial"), "format": "webdataset"})

    shard_set = open_shard_set({**tf, "label_base": 0})  # TF1 labels 1..3 read as 0-based
    assert shard_set.label(2) == 2
    with pytest.raises(DataError, match="data.label_base=0"):
        shard_set.label(3, "train-00000-of-00004")


def test_corrupt_shards_are_one_line_naming_the_record(converted: dict[str, Path]) -> None:
    data = (converted["tfrecord"] / "train-00000-of-00004").read_bytes()
    flipped = bytearray(data)
    flipped[100] ^= 1
    cases = [(data[:-3], "truncated"), (bytes(flipped), "checksum of record 0")]
    for bad, expected in [*cases, (b"not a tfrecord!!", "not a TFRecord")]:
        with pytest.raises(DataError, match=expected) as info:
            list(read_records("tfrecord", bad, "train-00000-of-00004"))
        assert str(info.value).startswith("train-00000-of-00004: ") and "\n" not in str(info.value)
    tar = (converted["webdataset"] / "train-00000-of-00004.tar").read_bytes()
    with pytest.raises(DataError, match="truncated or corrupt tar|not a tar"):
        list(read_records("webdataset", tar[:700], "t.tar"))


def test_cli_mistakes_are_one_line_and_exit_2(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst = str(tmp_path / "out")
    cases = [
        ([str(folder), dst, "format=zip", "shard_size=5"], "format=zip"),
        ([str(folder), dst, "format=tfrecord", "shard_size=0"], "shard_size=0"),
        ([str(folder), dst, "format=tfrecord", "shard_size=ten"], "shard_size=ten"),
        ([str(folder), dst, "format=tfrecord", "shard_size=5", "seed=-1"], "seed=-1"),
        ([str(folder), dst, "format=tfrecord", "shards=5"], "unknown argument shards=5"),
        ([str(folder), dst, "shard_size=5"], "format is not set"),
        ([str(folder), "format=tfrecord", "shard_size=5"], "expected SRC and DST"),
        ([str(tmp_path / "nope"), dst, "format=tfrecord", "shard_size=5"], "SRC="),
        ([str(folder / "train"), dst, "format=tfrecord", "shard_size=5"], f"SRC={folder}/train has no 'train'"),
    ]
    for argv, expected in cases:
        assert shards_main(["convert", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("imgcls: error: ") and expected in err, err
    assert not os.path.exists(dst)

    result = subprocess.run(
        [sys.executable, "-m", "imgcls.data.shards", "convert", str(folder), dst, "format=tfrecord", "shard_size=-3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [result.stderr.strip()] and "shard_size=-3" in result.stderr


def test_a_non_empty_destination_is_refused_and_untouched(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dst = tmp_path / "mine"
    dst.mkdir()
    (dst / "notes.txt").write_text("keep me")
    before = os.stat(dst / "notes.txt").st_mtime_ns
    assert shards_main(["convert", str(folder), str(dst), "format=webdataset", "shard_size=5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"DST={dst} exists and is not empty" in err
    assert os.listdir(dst) == ["notes.txt"] and (dst / "notes.txt").read_text() == "keep me"
    assert os.stat(dst / "notes.txt").st_mtime_ns == before
    assert shards_main(["convert", str(folder), str(dst / "notes.txt"), "format=webdataset", "shard_size=5"]) == 2
    assert "is not a folder" in capsys.readouterr().err

    empty = tmp_path / "empty"  # an empty folder is fine; the CLI reports the manifest
    empty.mkdir()
    assert shards_main(["convert", str(folder), str(empty), "format=webdataset", "shard_size=50"]) == 0
    out = capsys.readouterr()
    assert f"wrote {empty / 'manifest.json'}" in out.out and "train -> webdataset" in out.err
    assert sorted(os.listdir(empty)) == ["manifest.json", "train-00000-of-00001.tar", "validation-00000-of-00001.tar"]
    assert shards_main(["convert", str(folder), str(empty), "format=webdataset", "shard_size=50"]) == 2
    assert "it holds a complete conversion: manifest.json" in capsys.readouterr().err
    os.remove(empty / "manifest.json")  # as a killed conversion leaves it
    assert shards_main(["convert", str(folder), str(empty), "format=webdataset", "shard_size=50"]) == 2
    assert "an interrupted conversion? delete it and run again" in capsys.readouterr().err


# --- URL roots (through shards/remote.py; tests/test_shards_s3.py reads a bucket on moto's S3 server) -------


def test_a_url_root_opens_from_its_manifest_without_downloading(converted: dict[str, Path], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cfg = {"format": "tfrecord", "shard_cache": str(cache)}
    shard_set = open_shard_set({**cfg, "root": f"pipe:cat {converted['tfrecord']}"})
    assert shard_set.count("train") == 26 and shard_set.label_base == 1
    assert shard_set.splits["train"][0].url == f"pipe:cat {converted['tfrecord']}/train-00000-of-00004"
    assert not cache.exists()  # counts from the manifest: no shard fetched to open the set
    with pytest.raises(DataError) as info:  # neither a manifest nor a listing: both reasons, one line
        open_shard_set({**cfg, "root": f"pipe:cat {tmp_path / 'nothing'}"})
    message = str(info.value)
    assert "has no readable manifest.json (" in message and "cannot be listed (" in message and "\n" not in message


@pytest.mark.parametrize("kind", ["pipe", "absolute", "url"])
def test_a_manifest_names_its_shards_relative_to_its_root(
    converted: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """A manifest comes with the data, from whoever filled the bucket: a shard named by a command, an absolute path
    or a URL of its own is refused in one line (it would run, or read, what the manifest says)."""
    manifest = json.loads((converted["webdataset"] / "manifest.json").read_text())
    first = manifest["splits"]["train"]["shards"][0]
    first["name"] = {
        "pipe": f"pipe:cat {converted['webdataset'] / first['name']}",
        "absolute": str(converted["webdataset"] / first["name"]),
        "url": "http://127.0.0.1:9/train-00000-of-00004.tar",
    }[kind]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    for shard in manifest["splits"]["train"]["shards"][1:] + manifest["splits"]["val"]["shards"]:
        shutil.copy(converted["webdataset"] / shard["name"], tmp_path / shard["name"])
    with pytest.raises(DataError, match=str(tmp_path / "manifest.json")) as raised:
        open_shard_set({"root": str(tmp_path), "format": "webdataset"})
    assert len(str(raised.value).splitlines()) == 1


def test_a_key_too_long_for_ustar_gets_a_gnu_long_name_that_dali_reads(tmp_path: Path) -> None:
    import nvidia.dali.fn as fn

    key = "class_0/" + "x" * 150  # a file name over ustar's 100 bytes
    records = [(b"short", 1, "class_0/a"), (b"long", 2, key), (b"after", 0, "class_1/b")]
    data = write_shard("webdataset", records)
    assert data.count(b"././@LongLink") == 2  # KEY.jpg and KEY.cls; the other members are plain ustar
    assert list(read_records("webdataset", data)) == records
    (tmp_path / "long.tar").write_bytes(data)  # DALI fails on a pax header ("Underful sample"), not on this

    def reader():
        image, label = fn.readers.webdataset(paths=[str(tmp_path / "long.tar")], ext=["jpg", "cls"])
        return image, label

    assert [(image, int(label.tobytes())) for image, label in _run_dali(reader, 3)] == [(i, y) for i, y, _ in records]
