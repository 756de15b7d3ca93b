"""The torchvision path over shard files (data/shards/stream.py): the epoch assignment's distributed semantics, the
same images and labels as the folder they came from, mid-epoch resume, label bases and bad records.

Real JPEGs in real webdataset tars and TFRecord files, real DataLoader worker processes, the backend built
from the composed config as train.py builds it. The 2-process gloo run is tests/test_shards_ddp.py."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from imgcls.data.backends import make_backend
from imgcls.data.protocol import LoaderSpec
from imgcls.data.shards import tfrecord, webdataset
from imgcls.data.shards.convert import convert
from imgcls.data.shards.epoch_assignment import epoch_assignment, loader_order, rank_range
from imgcls.data.shards.manifest import manifest_document, write_manifest
from imgcls.data.shards.stream import ShardStreamSampler
from imgcls.data.torchvision.backend import ShardBackend
from imgcls.errors import DataError
from tests.conftest import compose_config, make_image_folder, tiny_overrides

UNEVEN = [7, 3, 11, 5, 9]  # 35 records in 5 shards


# --- shard files ------------------------------------------------------------------------------------------


def folder_records(folder: Path, split: str) -> list[tuple[str, bytes, int]]:
    """(relative path, JPEG bytes, label) in ImageFolder's order."""
    classes = sorted(p.name for p in (folder / split).iterdir())
    return [
        (f"{c}/{f.name}", f.read_bytes(), k)
        for k, c in enumerate(classes)
        for f in sorted((folder / split / c).iterdir())
    ]


def write_shards(
    records: list[tuple[str, bytes, int]], dst: Path, fmt: str, sizes: list[int], prefix: str, label_base: int = 0
) -> list[tuple[str, int]]:
    """Shards of the given sizes (uneven on purpose), records in the given order; [(file name, count)]."""
    assert sum(sizes) == len(records)
    dst.mkdir(parents=True, exist_ok=True)
    names, at = [], 0
    for i, size in enumerate(sizes):
        name = f"{prefix}-{i:05d}-of-{len(sizes):05d}" + (".tar" if fmt == "webdataset" else "")
        with open(dst / name, "wb") as out:
            writer = webdataset.ShardWriter(out) if fmt == "webdataset" else None
            for rel, data, label in records[at : at + size]:
                if writer is not None:
                    writer.write(webdataset.key_of(rel), data, label + label_base)
                else:
                    tfrecord.write_record(out, tfrecord.encode_example(data, label + label_base, rel))
            if writer is not None:
                writer.close()
        names.append((name, size))
        at += size
    return names


def shard_folder(folder: Path, dst: Path, fmt: str, train_sizes: list[int], val_sizes: list[int]) -> Path:
    """Shards of chosen uneven sizes (the converter makes them even), with a manifest."""
    splits = {
        "train": write_shards(folder_records(folder, "train"), dst, fmt, train_sizes, "train"),
        "val": write_shards(folder_records(folder, "val"), dst, fmt, val_sizes, "validation"),
    }
    classes = sorted(p.name for p in (folder / "train").iterdir())
    write_manifest(dst, manifest_document(fmt, 0, classes, splits))
    return dst


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 3 classes: 35 train images (12 each, one removed: an odd total), 15 val images
    root = make_image_folder(tmp_path_factory.mktemp("img"), classes=3, train_per_class=12, val_per_class=5)
    (root / "train" / "class_2" / "011.jpg").unlink()
    return root


@pytest.fixture(scope="module")
def shards(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Uneven webdataset shards. The assignment does not depend on the format (both formats: `converted`)."""
    return shard_folder(folder, tmp_path_factory.mktemp("uneven"), "webdataset", UNEVEN, [4, 6, 5])


@pytest.fixture(scope="module", params=["webdataset", "tfrecord"])
def converted(request: pytest.FixtureRequest, folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder through the converter (`python -m imgcls.data.shards convert`): tfrecord stores labels 1..N."""
    dst = tmp_path_factory.mktemp("converted") / request.param
    convert(folder, dst, request.param, shard_size=4, progress=False)
    return dst


def data_cfg(root: Path, *extra: str) -> Any:
    fmt = [] if (root / "train").is_dir() else [f"data.format={_format(root)}"]
    return compose_config(tiny_overrides(root, *fmt, *extra)).data


def _format(root: Path) -> str:
    return "webdataset" if any(root.glob("*.tar")) else "tfrecord"


def fingerprint(images: torch.Tensor) -> list[str]:
    return [hashlib.sha1(image.numpy().tobytes()).hexdigest() for image in images]


def batches(loader: Any, limit: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for images, labels in loader:
        out.append((images, labels))
        if limit is not None and len(out) == limit:
            break
    return out


def error_of(loader: Any) -> str:
    """The DataError a loader raises. Caught here rather than with pytest.raises, whose kept traceback would
    keep the loader's worker processes alive into the next test (10 s of shutdown there)."""
    try:
        batches(loader)
    except DataError as exc:
        return str(exc)
    raise AssertionError("the loader raised no DataError")


# --- the assignment, pure -----------------------------------------------------------------------------------


def test_train_assignment_every_rank_equal_batches_every_sample_once_but_the_remainder() -> None:
    world, batch, workers = 2, 4, 2
    total = sum(UNEVEN)
    q = total // (world * batch) * batch  # 16 per rank, 3 left over
    leftovers = []
    for epoch in range(3):
        seen: list[int] = []
        for rank in range(world):
            order = loader_order(epoch_assignment(UNEVEN, world, rank, batch, workers, 0, epoch, True), batch)
            assert len(order) == q  # equal batch counts: no rank waits for another in an all-reduce
            seen += order.tolist()
        assert len(set(seen)) == len(seen) == world * q  # disjoint over ranks
        leftovers.append(frozenset(range(total)) - set(seen))
        assert len(leftovers[-1]) == total - world * q
    assert len(set(leftovers)) > 1  # the remainder changes with the epoch (shard and record order)
    again = loader_order(epoch_assignment(UNEVEN, world, 1, batch, workers, 0, 2, True), batch)
    same = loader_order(epoch_assignment(UNEVEN, world, 1, batch, workers, 0, 2, True), batch)
    assert again.tolist() == same.tolist()
    other_seed = loader_order(epoch_assignment(UNEVEN, world, 1, batch, workers, 1, 2, True), batch)
    assert other_seed.tolist() != again.tolist()


def test_val_assignment_is_exact_contiguous_and_unshuffled() -> None:
    total = sum(UNEVEN)
    for world in (1, 2, 3, 4):
        for workers in (0, 1, 3):
            parts = [loader_order(epoch_assignment(UNEVEN, world, r, 4, workers, 0, 5, False), 4) for r in range(world)]
            assert sorted(np.concatenate(parts).tolist()) == list(range(total))  # every sample once, no padding
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
            for r, part in enumerate(parts):  # a rank's samples are its contiguous range of the shard order
                assert sorted(part.tolist()) == list(range(*rank_range(total, world, r, 4, False)))


def test_worker_chunks_are_contiguous_and_the_round_robin_keeps_them_apart() -> None:
    """Batch k of the sampler's order goes to DataLoader worker k % W (a real DataLoader with 2 processes),
    and each worker only sees the samples of its own chunk, i.e. of its own shards."""

    class WhoReads(Dataset):
        def __len__(self) -> int:
            return sum(UNEVEN)

        def __getitem__(self, index: Any) -> tuple[int, int]:
            return index[0], get_worker_info().id  # (sample id, augmentation seed) from the sampler

    sampler = ShardStreamSampler(UNEVEN, rank=0, world_size=1, batch_size=4, workers=2, training=True, seed=0)
    chunks = epoch_assignment(UNEVEN, 1, 0, 4, 2, 0, 0, True)
    got = list(DataLoader(WhoReads(), batch_size=4, sampler=sampler, num_workers=2))
    assert len(got) == 8
    for k, (ids, workers) in enumerate(got):
        assert set(workers.tolist()) == {k % 2}
        assert set(ids.tolist()) <= set(chunks[k % 2].tolist())
    # A contiguous chunk of the stream touches few shards: each worker reads at most 4 of the 5.
    offsets = np.cumsum([0, *UNEVEN])
    for chunk in chunks:
        assert len({int(np.searchsorted(offsets, i, side="right")) for i in chunk.tolist()}) < len(UNEVEN)


# --- through the backend ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_val_loader_yields_the_folders_images_and_labels(folder: Path, converted: Path) -> None:
    reference = make_backend(data_cfg(folder)).loader(LoaderSpec("val", 4))
    backend = make_backend(data_cfg(converted, "data.num_workers=2"))
    assert backend.shard_set.label_base == (1 if _format(converted) == "tfrecord" else 0)
    assert isinstance(backend, ShardBackend) and backend.classes == ["class_0", "class_1", "class_2"]
    one = [(h, int(y)) for x, ys in batches(reference) for h, y in zip(fingerprint(x), ys)]
    two = [(h, int(y)) for x, ys in batches(backend.loader(LoaderSpec("val", 4))) for h, y in zip(fingerprint(x), ys)]
    assert len(one) == 15 and sorted(two) == sorted(one)  # the same decoded, transformed tensors and labels
    assert len({h for h, _ in one}) == 15  # and the images differ, so this compares something


@pytest.mark.slow
def test_train_epoch_over_two_ranks_and_two_workers(shards: Path) -> None:
    """Without random crops or flips, a train sample's tensor identifies it: across 2 ranks x 2 worker
    processes the epoch is the whole train set minus 35 - 2 * 16 = 3 samples, disjoint, 4 batches each."""
    fixed = ("data.train_crop_scale=[1,1]", "data.train_crop_ratio=[1,1]", "data.hflip=0", "data.num_workers=2")
    backend = make_backend(data_cfg(shards, *fixed))
    everything = backend.dataset("train")
    by_hash = {fingerprint(everything[i][0][None])[0]: i for i in range(len(everything))}
    assert len(by_hash) == 35
    seen = []
    for rank in range(2):
        got = batches(backend.loader(LoaderSpec("train", 4, rank, 2, 0)))
        assert len(got) == 4 and all(len(y) == 4 for _, y in got)
        for images, labels in got:
            for h, y in zip(fingerprint(images), labels.tolist()):
                assert everything[by_hash[h]][1] == y
                seen.append(by_hash[h])
    assert len(seen) == len(set(seen)) == 32


@pytest.mark.slow
def test_resume_after_k_batches_continues_with_the_uninterrupted_batches(shards: Path) -> None:
    """Random crops and flips on, 2 workers: the resumed loader (a new data module, as in a new process)
    yields, bitwise, the batches an uninterrupted epoch yields after the first k, from the position the data
    module puts in a checkpoint (ClassificationDataModule.state_dict, which Lightning stores)."""
    from imgcls.data.datamodule import ClassificationDataModule

    cfg = data_cfg(shards, "data.num_workers=2", "data.hflip=0.5")
    full = make_backend(cfg).loader(LoaderSpec("train", 4))
    full.sampler.set_epoch(1)
    expected = batches(full)
    first = ClassificationDataModule(cfg, batch_size=4)
    loader = first.train_dataloader()
    loader.sampler.set_epoch(1)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches(loader, 3), expected))
    state = first.state_dict()
    assert state == {"train_loader": {"epoch": 1, "consumed": 12}, "epoch": 0}  # the trainer's epoch: none here
    resumed = ClassificationDataModule(cfg, batch_size=4)
    resumed.load_state_dict(state)
    rest = batches(resumed.train_dataloader())
    assert len(rest) == len(expected) - 3 == 5  # 35 // 4 = 8 batches an epoch
    for (x, y), (ex, ey) in zip(rest, expected[3:]):
        assert torch.equal(x, ex) and torch.equal(y, ey)
    assert resumed.state_dict() == {"train_loader": {"epoch": 1, "consumed": 32}, "epoch": 0}


@pytest.mark.slow
def test_label_base_one_tfrecords_without_manifest(folder: Path, tmp_path: Path) -> None:
    """NVIDIA's TF1 layout: train-*/validation-* TFRecords, labels 1..N, no manifest: label_base=auto reads
    them as 0..N-1; label_base=0 gives a one-line DataError naming data.label_base, raised in the main
    process although a worker process found it."""
    write_shards(folder_records(folder, "train"), tmp_path, "tfrecord", [20, 15], "train", label_base=1)
    write_shards(folder_records(folder, "val"), tmp_path, "tfrecord", [8, 7], "validation", label_base=1)
    backend = make_backend(data_cfg(tmp_path, "data.num_classes=3", "data.num_workers=2"))
    labels = torch.cat([y for _, y in batches(backend.loader(LoaderSpec("val", 4)))])
    assert sorted(labels.tolist()) == [0] * 5 + [1] * 5 + [2] * 5
    wrong = make_backend(data_cfg(tmp_path, "data.num_classes=3", "data.num_workers=2", "data.label_base=0"))
    message = error_of(wrong.loader(LoaderSpec("val", 4)))
    assert "data.label_base" in message and "validation-00001-of-00002:class_2/" in message and "\n" not in message


@pytest.fixture
def with_bad_record(folder: Path, tmp_path: Path) -> tuple[Path, str]:
    train = folder_records(folder, "train")
    rel, data, label = train[9]
    train[9] = (rel, data[: len(data) // 2], label)  # a truncated JPEG inside the first shard
    splits = {
        "train": write_shards(train, tmp_path, "webdataset", UNEVEN, "train"),
        "val": write_shards(folder_records(folder, "val"), tmp_path, "webdataset", [15], "validation"),
    }
    write_manifest(tmp_path, manifest_document("webdataset", 0, ["class_0", "class_1", "class_2"], splits))
    # Shard 1 holds records 7..9 of the list: record 9 is its third.
    return tmp_path, f"{tmp_path / 'train-00001-of-00005.tar'}:{webdataset.key_of(rel)}"


@pytest.mark.slow
def test_bad_record_is_skipped_and_recorded_like_a_bad_file(with_bad_record: tuple[Path, str]) -> None:
    root, where = with_bad_record
    backend = make_backend(data_cfg(root, "data.num_workers=2"))
    got = batches(backend.loader(LoaderSpec("train", 5)))
    assert sum(len(y) for _, y in got) == 34  # 35 in 7 batches of 5, minus the bad one
    assert list(backend.bad_images.files) == [where]


@pytest.mark.slow
def test_bad_record_stops_the_run_naming_shard_and_record(with_bad_record: tuple[Path, str]) -> None:
    root, where = with_bad_record
    backend = make_backend(data_cfg(root, "data.num_workers=2", "data.on_bad_image=error"))
    message = error_of(backend.loader(LoaderSpec("train", 5)))
    assert message.startswith(where + " is not a decodable image") and "data.on_bad_image=error" in message
    assert "\n" not in message


def test_plan_mode_counts_the_shard_sets_train_images(shards: Path) -> None:
    from imgcls.run.plan import train_images

    assert train_images(data_cfg(shards)) == (35, f"{_format(shards)} shards in {shards}")


@pytest.mark.slow
def test_a_shard_shorter_than_its_listing_and_too_few_samples_are_one_line(folder: Path, tmp_path: Path) -> None:
    splits = {
        "train": write_shards(folder_records(folder, "train"), tmp_path, "webdataset", [35], "train"),
        "val": write_shards(folder_records(folder, "val"), tmp_path, "webdataset", [15], "validation"),
    }
    splits["val"] = [(splits["val"][0][0], 16)]  # the manifest promises one record more than the shard holds
    write_manifest(tmp_path, manifest_document("webdataset", 0, ["class_0", "class_1", "class_2"], splits))
    backend = make_backend(data_cfg(tmp_path))
    message = error_of(backend.loader(LoaderSpec("val", 4)))
    assert message == f"shard {tmp_path / 'validation-00000-of-00001.tar'} holds 15 records, its listing says 16"
    with pytest.raises(DataError, match=r"has 35 train samples, fewer than one batch on each rank \(2 x "):
        backend.loader(LoaderSpec("train", 32, 0, 2, 0))
