"""dali_cpu reading shard files (data.format=tfrecord|webdataset) with DALI's own readers, on CPU: the same
images and labels as from the folder, equal train batches per rank, label bases, bad records, index files
made in the cache only, and what a rebuilt loader (a resume) reads."""

from __future__ import annotations

import io
import shutil
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from imgcls.data.backends import make_backend
from imgcls.data.protocol import LoaderSpec
from imgcls.data.shards.convert import convert
from imgcls.errors import DataError
from tests.conftest import compose_config, make_image_folder, tiny_overrides

pytest.importorskip("nvidia.dali")

FORMATS = ("tfrecord", "webdataset")
SHARD_SIZE = 11  # 33 train images -> 3 shards of 11, 21 val -> 10 + 11: records split unevenly over the ranks


def _val_labels(folder: Path) -> list[int]:
    classes = sorted(p.name for p in (folder / "val").iterdir())
    return sorted(k for k, name in enumerate(classes) for _ in (folder / "val" / name).iterdir())


def make_shards(folder: Path, out: Path, fmt: str) -> Path:
    """FOLDER converted as by `python -m imgcls.data.shards convert` (in-process): train shuffled, val in order;
    TFRecords with TF1's 1-based labels and index files in OUT/dali_idx, WebDataset with 0-based labels."""
    convert(folder, out, fmt, SHARD_SIZE, seed=0, progress=False)
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 33 train images: 16 and 17 a rank on 2 ranks. 21 val images: uneven val shards (10 + 11).
    return make_image_folder(tmp_path_factory.mktemp("folder"), classes=3, train_per_class=11, val_per_class=7)


@pytest.fixture(scope="module")
def shards(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("shards")
    return {fmt: make_shards(folder, base / fmt, fmt) for fmt in FORMATS}


def backend_for(root: Path | str, cache: Path, *extra: str):
    overrides = tiny_overrides(root, "data.backend=dali_cpu", f"data.shard_cache={cache}", *extra)
    return make_backend(compose_config(overrides).data)


def epoch(loader) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*[(x, y) for x, y, *_ in loader])
    return torch.cat(images), torch.cat(labels)


def by_content(images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and labels sorted by (label, pixel sum): an order that does not depend on the reader's."""
    keys = labels.double() * 1e9 + images.double().sum(dim=(1, 2, 3))
    order = torch.argsort(keys)
    return images[order], labels[order]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_val_from_shards_matches_the_folder(folder: Path, shards: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    reference = by_content(*epoch(backend_for(folder, tmp_path).loader(LoaderSpec("val", 4))))
    backend = backend_for(shards[fmt], tmp_path, f"data.format={fmt}")
    assert backend.classes == ["class_0", "class_1", "class_2"]
    images, labels = by_content(*epoch(backend.loader(LoaderSpec("val", 4))))
    assert labels.tolist() == reference[1].tolist() == _val_labels(folder)
    assert torch.allclose(images, reference[0])
    # Two ranks: each val record exactly once across them, no padding (21 records: 10 + 11).
    parts = [epoch(backend.loader(LoaderSpec("val", 4, rank, 2, seed=0))) for rank in range(2)]
    assert [len(labels) for _, labels in parts] == [10, 11]
    images, labels = by_content(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
    assert labels.tolist() == reference[1].tolist() and torch.allclose(images, reference[0])


def _traces(trace: Path, rank: int, epoch: int) -> list[str]:
    return (trace / f"train_rank{rank}_epoch{epoch}.txt").read_text().split()


# (batch, batches a rank): batch 3 reads 15 of a rank's 16-17 records; batch 4 reads 16, all of the shorter
# shard, whose reader pads a 17th: DALI's iterator left that padded batch to open the next epoch (records
# read twice in one epoch, others never) until the loader ran out the reader's epoch itself.
# resize: debug=tiny's 32 px train crops resize in DALI (auto); "torch" takes dali_cpu's ImageNet path (the
# ragged iterator and the background torch resize, data/dali/host_resize.py).
@pytest.mark.slow
@pytest.mark.parametrize(
    "fmt,batch,steps,resize",
    [(fmt, batch, steps, "auto") for fmt in (*FORMATS, "folder") for batch, steps in ((3, 5), (4, 4))]
    + [(fmt, 4, 4, "torch") for fmt in FORMATS],
)
def test_train_over_two_ranks(
    folder: Path, shards: dict[str, Path], tmp_path: Path, fmt: str, batch: int, steps: int, resize: str
) -> None:
    trace = tmp_path / "trace"
    root, extra = (folder, ()) if fmt == "folder" else (shards[fmt], (f"data.format={fmt}",))
    backend = backend_for(root, tmp_path, *extra, f"data.trace_dir={trace}", f"data.dali_train_resize={resize}")
    loaders = [backend.loader(LoaderSpec("train", batch, rank, 2, seed=0)) for rank in range(2)]
    assert len(loaders[0]) == len(loaders[1]) == steps  # equal steps on every rank (DDP would hang otherwise)
    epochs, read = 3, steps * batch  # records a rank reads an epoch
    for _ in range(epochs):
        for loader in loaders:
            batches = list(loader)
            assert len(batches) == steps and all(x.shape == (batch, 3, 32, 32) for x, _ in batches)
            assert all(0 <= int(y) < 3 for _, labels in batches for y in labels)
    seen: Counter = Counter()
    for e in range(epochs):
        ranks = [_traces(trace, r, e) for r in range(2)]
        assert [len(r) for r in ranks] == [read, read]
        # Every record at most once an epoch across the ranks: 2 x read of the 33, the other 33 - 2 x read
        # (1 or 3) left over, not the same ones every epoch.
        assert len(set(ranks[0]) | set(ranks[1])) == 2 * read
        seen.update(ranks[0] + ranks[1])
    assert len(seen) == 33


@pytest.mark.slow
def test_tfrecord_label_base(folder: Path, shards: dict[str, Path], tmp_path: Path) -> None:
    # The converter writes TF1's labels 1..N (manifest label_base 1). TF1 build_imagenet_data.py's own
    # folders have no manifest: label_base auto is 1 for TFRecords, and data.num_classes names the classes.
    tf1 = tmp_path / "tf1"
    shutil.copytree(shards["tfrecord"], tf1)
    (tf1 / "manifest.json").unlink()
    for root, extra in ((shards["tfrecord"], ()), (tf1, ("data.num_classes=3",))):
        backend = backend_for(root, tmp_path / "cache", "data.format=tfrecord", *extra)
        _, labels = epoch(backend.loader(LoaderSpec("val", 4)))
        assert sorted(labels.tolist()) == _val_labels(folder)  # 0..2, not 1..3
    wrong = backend_for(tf1, tmp_path / "cache", "data.format=tfrecord", "data.num_classes=3", "data.label_base=0")
    with pytest.raises(DataError, match="data.label_base=0") as info:
        epoch(wrong.loader(LoaderSpec("val", 4)))
    assert "\n" not in str(info.value) and "validation-0000" in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_bad_record_skipped_or_stops_naming_the_shard(folder: Path, tmp_path: Path, fmt: str) -> None:
    # class_1/003.jpg truncated, in val (record 10 of 21: the second val shard) and in train.
    source = tmp_path / "folder"
    shutil.copytree(folder, source)
    for split in ("train", "val"):
        path = source / split / "class_1" / "003.jpg"
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    root = make_shards(source, tmp_path / "bad", fmt)
    backend = backend_for(root, tmp_path / "cache", f"data.format={fmt}")
    _, labels = epoch(backend.loader(LoaderSpec("val", 4)))
    assert len(labels) == 20 and Counter(labels.tolist())[1] == 6  # the bad class_1 record dropped
    ((name, reason),) = backend.bad_images.files.items()
    assert name == f"{root}/validation-00001-of-00002{'.tar' if fmt == 'webdataset' else ''}:class_1/003" + (
        ".jpg" if fmt == "tfrecord" else ""
    )  # the record's image/filename, or its tar key
    assert reason.startswith("truncated")
    strict = backend_for(root, tmp_path / "cache", f"data.format={fmt}", "data.on_bad_image=error")
    with pytest.raises(DataError, match="validation-00001-of-00002") as info:
        epoch(strict.loader(LoaderSpec("val", 4)))
    assert "\n" not in str(info.value)
    with pytest.raises(DataError, match=r"train-0000\d-of-00003"):  # the train pipeline checks too
        epoch(strict.loader(LoaderSpec("train", 3)))  # 11 batches of 3: every record


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_missing_index_files_are_made_in_the_cache(shards: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "tfrecord"
    shutil.copytree(shards["tfrecord"], root)
    shutil.rmtree(root / "dali_idx")  # as TF1's folders: no index files
    before = _snapshot(root)
    cache = tmp_path / "cache"
    backend = backend_for(root, cache, "data.format=tfrecord")
    epoch(backend.loader(LoaderSpec("train", 4)))
    epoch(backend.loader(LoaderSpec("val", 4)))
    assert _snapshot(root) == before  # nothing written, moved or touched in the data folder
    made = sorted(p.name for p in (cache / "dali_idx").rglob("*.idx"))
    assert made == sorted(f"{p.name}.idx" for p in root.iterdir() if p.name.startswith(("train-", "validation-")))


def test_a_rebuilt_loader_restarts_the_epoch_stream(shards: dict[str, Path], tmp_path: Path) -> None:
    # What a resume gets (docs/shards.md): a new pipeline reads the first epoch's stream again, from its
    # start, with the same number of batches; Lightning keeps the step count and the LR.
    backend = backend_for(shards["webdataset"], tmp_path, "data.format=webdataset")
    loader = backend.loader(LoaderSpec("train", 4, 0, 2, seed=0))
    first = epoch(loader)
    epoch(loader)
    again = epoch(
        backend_for(shards["webdataset"], tmp_path, "data.format=webdataset").loader(LoaderSpec("train", 4, 0, 2, 0))
    )
    assert torch.equal(first[1], again[1]) and torch.allclose(first[0], again[0])


@pytest.fixture(scope="module")
def s3_root(shards: dict[str, Path]) -> Iterator[tuple[str, dict[str, str]]]:
    """The TFRecord shards and manifest (no index files) in a bucket of moto's real S3 server on 127.0.0.1."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip
    client.create_bucket(Bucket="imgcls-dali")
    for path in shards["tfrecord"].iterdir():
        if path.is_file():
            client.put_object(Bucket="imgcls-dali", Key=f"tf/{path.name}", Body=path.read_bytes())
    yield "s3://imgcls-dali/tf", {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    server.stop()


@pytest.mark.slow
def test_s3_shards_are_read_from_the_local_cache(
    folder: Path, s3_root: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, options = s3_root
    cache = tmp_path / "cache"
    storage = [f"+data.storage_options.{k}={v}" for k, v in options.items()]
    backend = backend_for(url, cache, "data.format=tfrecord", *storage)
    reference = by_content(*epoch(backend_for(folder, tmp_path).loader(LoaderSpec("val", 4))))
    images, labels = by_content(*epoch(backend.loader(LoaderSpec("val", 4))))
    assert labels.tolist() == reference[1].tolist() and torch.allclose(images, reference[0])
    # DALI read local copies: the shards under data.shard_cache/remote/s3/<bucket>/..., their index files made there.
    copied = cache / "remote" / "s3" / "imgcls-dali" / "tf"
    copies = sorted(p.name for p in copied.iterdir() if not p.name.startswith("."))
    assert copies == ["validation-00000-of-00002", "validation-00001-of-00002"]
    assert len(list((cache / "dali_idx").rglob("validation-*.idx"))) == 2


def test_unreadable_shards_are_one_line(shards: dict[str, Path], tmp_path: Path) -> None:
    # A tar sample without its .cls member, and a TFRecord file cut short after its index was made: DALI's
    # readers fail (not a bad image: the shard itself is broken), with one line naming the file.
    wds, tf = tmp_path / "wds", tmp_path / "tf"
    shutil.copytree(shards["webdataset"], wds)
    shutil.copytree(shards["tfrecord"], tf)
    tar = wds / "validation-00000-of-00002.tar"
    with tarfile.open(tar) as archive:
        members = [(m, archive.extractfile(m).read()) for m in archive.getmembers() if m.name != "class_0/001.cls"]
    with tarfile.open(tar, "w", format=tarfile.USTAR_FORMAT) as archive:
        for member, data in members:
            archive.addfile(member, io.BytesIO(data))
    record = tf / "validation-00001-of-00002"
    record.write_bytes(record.read_bytes()[:-100])
    for root, fmt, broken in ((wds, "webdataset", tar), (tf, "tfrecord", record)):
        with pytest.raises(DataError, match=f"^DALI could not read the data: .*{broken}") as info:
            epoch(backend_for(root, tmp_path / "cache", f"data.format={fmt}").loader(LoaderSpec("val", 4)))
        assert "\n" not in str(info.value)
