"""The dali_cpu / dali_gpu backends with real DALI on CPU (device_id=None): labels, parity with
torchvision, crop ranges, exact per-rank parts, Lightning runs (one process and 2-process DDP)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.datasets import ImageFolder

from imgcls.data.backends import make_backend
from imgcls.data.file_list import FileList
from imgcls.data.protocol import LoaderSpec
from imgcls.errors import ConfigError
from tests import warm_python
from tests.conftest import compose_config, make_image_folder, read_report, run_cli, sample_photos, tiny_overrides

pytest.importorskip("nvidia.dali")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="dali_gpu needs a CUDA GPU")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 24 train images (divisible by 2 ranks x batch 4: the ranks' train parts cover everything),
    # 21 val images (odd: uneven val parts, where padding would show).
    root = make_image_folder(tmp_path_factory.mktemp("dali"), classes=3, train_per_class=8, val_per_class=7)
    return root


def data_cfg(root: Path, *extra: str):
    return compose_config(tiny_overrides(root, "data.backend=dali_cpu", *extra)).data


def epoch(loader) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*[(x, y) for x, y, *_ in loader])
    return torch.cat(images), torch.cat(labels)


@pytest.mark.slow
def test_backend_choice_errors(folder: Path) -> None:
    # data.backend=dali_fast: config.checks refuses it (tests/test_config_checks.py BAD)
    with pytest.raises(ConfigError, match="data.interpolation=box is not supported by DALI; allowed: bilinear"):
        make_backend(data_cfg(folder, "data.interpolation=box"))
    # data.dali_resize_threads / dali_host_prefetch: config.checks refuses a bad value (tests/test_config_home.py)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="dali_gpu needs a CUDA GPU") as info:
            make_backend(data_cfg(folder, "data.backend=dali_gpu"))
        assert "\n" not in str(info.value)


@pytest.mark.slow
def test_labels_identical_to_imagefolder(tmp_path: Path) -> None:
    # Class names whose sorted order is not the creation order (uppercase sorts first, "a10" < "a2").
    root = tmp_path / "data"
    for split in ("train", "val"):
        for k, name in enumerate(["b", "a2", "a10", "C"]):
            (root / split / name).mkdir(parents=True)
            for i in range(3):
                pixels = np.zeros((24, 24, 3), np.uint8)
                pixels[..., 0] = 60 * k + 10  # the class is readable from the red channel
                Image.fromarray(pixels).save(root / split / name / f"{i}.jpg", quality=95)
    backend = make_backend(data_cfg(root))
    reference = ImageFolder(str(root / "val"))
    assert backend.classes == reference.classes == ["C", "a10", "a2", "b"]
    _, labels = epoch(backend.loader(LoaderSpec("val", 4)))
    assert labels.tolist() == reference.targets
    # Train is shuffled: each image must still carry its own class's label.
    images, labels = epoch(backend.loader(LoaderSpec("train", 4)))
    assert sorted(labels.tolist()) == sorted(ImageFolder(str(root / "train")).targets)
    red = images[:, 0].float().mean(dim=(1, 2)) / 255  # dali_cpu's batches are uint8: red in 0..1
    class_of_red = {reference.class_to_idx[n]: 60 * k + 10 for k, n in enumerate(["b", "a2", "a10", "C"])}
    expected = torch.tensor([class_of_red[int(y)] / 255 for y in labels])
    assert torch.allclose(red, expected, atol=0.02)


def _photos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """16 real photos (conftest.sample_photos)."""
    return sample_photos(tmp_path_factory.mktemp("photos"), 16)


@pytest.mark.slow
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_val_pipeline_matches_torchvision(tmp_path_factory: pytest.TempPathFactory, interpolation: str) -> None:
    """Same photos, same geometry: resize shorter side to 256, centre crop 224, normalize.

    Tolerance: both decode with libjpeg-turbo (identical pixels) and resize with a triangle / cubic
    antialiasing filter of the same support, rounding to uint8 before normalizing; they differ only
    in the filter's fixed-point arithmetic, so most pixels differ by at most one 8-bit level
    (1/255/0.224 = 0.0175 normalized). Bound: mean |diff| < 0.01 and 99.9% of values within
    2 levels (0.035); bicubic overshoot is clamped a little differently near hard edges, hence
    a percentile rather than a max.
    """
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    from imgcls.data.dali.pipelines import READER, FolderSource, val_pipeline
    from imgcls.data.dali.settings import DaliSettings
    from imgcls.data.device_normalize import DeviceNormalize
    from imgcls.data.transforms import val_transform

    files = _photos(tmp_path_factory)
    cfg = data_cfg(Path("/unused"), f"data.interpolation={interpolation}", "model.image_size=224")
    transform = val_transform(cfg)
    reference = torch.stack([transform(Image.open(f).convert("RGB")) for f in files])
    listing = tmp_path_factory.mktemp("list") / "files.txt"
    listing.write_text("".join(f"{f} {i}\n" for i, f in enumerate(files)))
    pipe = val_pipeline(
        source=FolderSource(str(listing), None), settings=DaliSettings.from_config(cfg, gpu=False), shard_id=0,
        num_shards=1, size=224, resize=256, batch_size=8, num_threads=1, device_id=None,
    )  # fmt: skip
    iterator = DALIGenericIterator(
        pipe, ["data", "index", "bad"], reader_name=READER, last_batch_policy=LastBatchPolicy.PARTIAL
    )
    dali = DeviceNormalize(cfg.mean, cfg.std)(torch.cat([batch[0]["data"].clone() for batch in iterator]))
    assert dali.shape == reference.shape == (len(files), 3, 224, 224)
    diff = (dali - reference).abs()
    assert diff.mean() < 0.01, f"mean |diff| {diff.mean():.4f}"
    assert diff.flatten().kthvalue(int(0.999 * diff.numel())).values < 0.035


@pytest.mark.slow
@pytest.mark.parametrize("resize", ["torch", "dali"])
def test_train_crops_respect_area_and_aspect(tmp_path: Path, resize: str) -> None:
    root = make_image_folder(tmp_path / "big", classes=1, train_per_class=2, val_per_class=1, size=(400, 300))
    for scale, ratio in (((0.08, 1.0), (0.75, 4 / 3)), ((0.3, 0.4), (1.0, 1.5))):
        cfg = data_cfg(
            root,
            f"data.train_crop_scale=[{scale[0]},{scale[1]}]",
            f"data.train_crop_ratio=[{ratio[0]},{ratio[1]}]",
            f"data.dali_train_resize={resize}",
        )
        backend = make_backend(cfg)
        backend.settings = replace(backend.settings, with_crop_shape=True)  # the crops' shapes as an output
        loader = backend.loader(LoaderSpec("train", 2, seed=3))
        shapes = torch.cat([next(iter(loader))[2] for _ in range(60)]).double()  # (h, w, c) of each crop
        area = shapes[:, 0] * shapes[:, 1] / (400 * 300)
        aspect = shapes[:, 1] / shapes[:, 0]
        slack = 0.02  # crops are whole pixels
        assert area.min() >= scale[0] - slack and area.max() <= scale[1] + slack, (area.min(), area.max())
        assert aspect.min() >= ratio[0] - slack and aspect.max() <= ratio[1] + slack, (aspect.min(), aspect.max())
        assert area.std() > 0.02 and aspect.std() > 0.02  # really random
        assert next(iter(loader))[0].shape == (2, 3, 32, 32)  # then resized to the train size


def _photo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real photos as a one-class ImageFolder (train and val)."""
    root = tmp_path_factory.mktemp("photo_folder")
    for split in ("train", "val"):
        (root / split / "photo").mkdir(parents=True)
        for i, photo in enumerate(_photos(tmp_path_factory)):
            (root / split / "photo" / f"{i:02d}.jpg").symlink_to(photo)
    return root


@pytest.mark.slow
def test_host_resize_matches_dali_resize(tmp_path_factory: pytest.TempPathFactory) -> None:
    """dali_train_resize=torch (the dali_cpu default) trains on the same pixels as NVIDIA's fn.resize.

    Both graphs draw the same ROI crop and flip (same pipeline seed, same operators before the resize),
    then resize bilinearly without antialiasing from the same pixel centres; they differ only in the
    kernels' fixed-point rounding (measured: mean |diff| 0.003 on these photos). Bound: mean |diff| under
    0.01 (0.6 of an 8-bit level, 0.0175 normalized) and 99% of values within 3 levels; another seed's crops
    measured 1.4, and a missing or extra flip 0.5 and more."""
    root = _photo_folder(tmp_path_factory)
    batches = {}
    for resize in ("torch", "dali"):
        cfg = data_cfg(root, f"data.dali_train_resize={resize}", "model.image_size=224")
        backend = make_backend(cfg)
        loader = backend.loader(LoaderSpec("train", 8, seed=5))
        batches[resize] = [(backend.on_device((x.clone(), y))[0], y) for x, y in loader]
    torch_images, dali_images = (torch.cat([x for x, _ in batches[k]]) for k in ("torch", "dali"))
    assert torch_images.shape == dali_images.shape == (16, 3, 224, 224)
    diff = (torch_images - dali_images).abs()
    assert diff.mean() < 0.01, f"mean |diff| {diff.mean():.4f}"
    assert diff.flatten().kthvalue(int(0.99 * diff.numel())).values < 3 * 0.0175
    unflipped = (torch_images - dali_images.flip(-1)).abs().mean(dim=(1, 2, 3))
    assert (unflipped > 0.1).any()  # the flips matter, so the bound above really checks them


def test_host_resize_choice() -> None:
    from imgcls.data.dali.host_resize import resize_on_host

    assert resize_on_host("auto", gpu=False, augment=None, interpolation="bilinear", size=224)
    assert resize_on_host("auto", gpu=False, augment=None, interpolation="bilinear", size=128)
    assert not resize_on_host("auto", gpu=False, augment=None, interpolation="bilinear", size=96)
    assert resize_on_host("torch", gpu=False, augment=None, interpolation="bilinear", size=32)
    assert not resize_on_host("auto", gpu=False, augment="randaugment", interpolation="bicubic")
    assert not resize_on_host("auto", gpu=False, augment=None, interpolation="triangular")
    assert not resize_on_host("auto", gpu=True, augment=None, interpolation="bilinear")
    assert not resize_on_host("dali", gpu=False, augment=None, interpolation="bilinear")
    # dali_train_resize=torch with an augment policy or an interpolation torch lacks: config.checks refuses it
    # (tests/test_config_home.py).


@pytest.mark.parametrize("world", [1, 2, 3])
def test_val_parts_cover_every_image_once(folder: Path, world: int) -> None:
    backend = make_backend(data_cfg(folder, "data.trace_dir=null"))
    reference = ImageFolder(str(folder / "val")).targets
    for _ in range(2):  # two epochs: the second must be exact too
        labels = []
        for rank in range(world):
            loader = backend.loader(LoaderSpec("val", 4, rank, world, seed=0))
            batches = [y for _, y in loader]
            assert len(batches) == len(loader)
            assert all(len(y) == 4 for y in batches[:-1])
            labels += torch.cat(batches).tolist()
        assert sorted(labels) == sorted(reference)  # nothing dropped, nothing duplicated


@pytest.mark.parametrize("world", [2, 3])
def test_val_pipeline_gets_only_its_parts_files(
    folder: Path, tmp_path: Path, world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DALI keeps a copy of every name it is given (docs/data-backends.md "Startup"): val hands each rank
    only its part's lines, and each epoch reads that part once, as when it got the whole list."""
    given: dict[int, list[bytes]] = {}
    write_list = FileList.write_list

    def record(self: FileList, path: str, *part: int | None, **order: object) -> None:
        write_list(self, path, *part, **order)
        given[len(given)] = Path(path).read_bytes().splitlines()

    monkeypatch.setattr(FileList, "write_list", record)
    backend = make_backend(data_cfg(folder, f"data.trace_dir={tmp_path}"))
    for rank in range(world):
        loader = backend.loader(LoaderSpec("val", 4, rank, world, seed=0))
        for _ in range(2):  # the second epoch reads the same part
            list(loader)
    for rank in range(world):
        begin, end = rank * 21 // world, (rank + 1) * 21 // world
        lines = given[rank]
        assert [int(line.rsplit(b" ", 1)[1]) for line in lines] == list(range(begin, end))
        assert [line.rsplit(b" ", 1)[0].decode() for line in lines] == [
            backend.files("val").relative(i) for i in range(begin, end)
        ]
        for e in range(2):  # each epoch: the part, once (DALI starts epoch 1 where its read-ahead left off)
            read = sorted(map(int, (tmp_path / f"val_rank{rank}_epoch{e}.txt").read_text().split()))
            assert read == list(range(begin, end))
    given.clear()
    backend.loader(LoaderSpec("train", 4, 1, world, seed=0))
    assert len(given[0]) == 24  # train: the whole list (DALI shuffles it before taking the rank's part)


def test_train_parts_are_disjoint_with_equal_steps(folder: Path, tmp_path: Path) -> None:
    backend = make_backend(data_cfg(folder, f"data.trace_dir={tmp_path}"))
    loaders = [backend.loader(LoaderSpec("train", 4, rank, 2, seed=0)) for rank in range(2)]
    assert len(loaders[0]) == len(loaders[1]) == 3  # 24 images / 2 ranks / batch 4
    for _ in range(2):
        for loader in loaders:
            batches = list(loader)
            assert len(batches) == 3 and all(x.shape == (4, 3, 32, 32) for x, _ in batches)
    for e in range(2):
        parts = [set(map(int, (tmp_path / f"train_rank{r}_epoch{e}.txt").read_text().split())) for r in range(2)]
        assert not parts[0] & parts[1] and len(parts[0] | parts[1]) == 24


def _count_dali_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Patch DALI's iterators to count the batches taken from them (a batch a pipeline decoded). An iterator
    runs its first batch when it is built (prepare_first_batch) and hands that same batch out at its first
    __next__: counted once, where it is run."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, DALIRaggedIterator

    taken = [0]
    for cls in (DALIGenericIterator, DALIRaggedIterator):
        real = cls.__next__

        def counted(self, real=real):
            prepared = getattr(self, "_first_batch", None) is not None
            batch = real(self)
            taken[0] += not prepared
            return batch

        monkeypatch.setattr(cls, "__next__", counted)
    return taken


@pytest.mark.parametrize("resize", ["dali", "torch"])
def test_an_epoch_taken_to_its_length_costs_one_reader_epoch(
    folder: Path, monkeypatch: pytest.MonkeyPatch, resize: str
) -> None:
    """The trainer takes len(loader) batches and stops, without the StopIteration after them. The next epoch's
    start ran out the old epoch with a for loop, whose iter() reset DALI's iterator into the reader's next epoch
    and ran that out too: every epoch after the first decoded a whole epoch and threw it away. Now each epoch
    takes its own batches only (the first epoch's extra one is the iterator's prefetched first batch)."""
    taken = _count_dali_batches(monkeypatch)
    loader = make_backend(data_cfg(folder, f"data.dali_train_resize={resize}")).loader(LoaderSpec("train", 8))
    per_epoch = []
    for _ in range(3):
        batches = iter(loader)
        for _ in range(len(loader)):  # as Lightning's fit loop: len() batches, no call after them
            next(batches)
        per_epoch.append(taken[0] - sum(per_epoch))
    assert len(loader) == 3 and per_epoch[1:] == [3, 3], per_epoch  # 24 images / 8; before: [6, 6]


@pytest.mark.parametrize("split,resize", [("train", "dali"), ("train", "torch"), ("val", "dali")])
def test_an_epoch_left_early_costs_only_its_batches(
    folder: Path, monkeypatch: pytest.MonkeyPatch, split: str, resize: str
) -> None:
    """trainer.limit_train_batches / limit_val_batches take a few batches of each epoch. The next epoch's start ran
    out the rest of the old one (5 of 6 batches here; the whole split on ImageNet: 1,083 s at a resumed start);
    now it starts a new pipeline at the next epoch. A resumed loader at such an epoch's end (its position says
    `early`) starts that same next epoch fresh, with the same batches as the loader that saved it."""
    taken = _count_dali_batches(monkeypatch)
    backend = make_backend(data_cfg(folder, f"data.dali_train_resize={resize}"))
    size = 4 if split == "train" else 3  # 24 train images: 6 batches; 21 val images: 7 batches
    loader = backend.loader(LoaderSpec(split, size, limit_batches=1))
    firsts, reads = [], []
    for _ in range(3):
        before = taken[0]
        firsts.append(next(iter(loader))[1].tolist())  # one batch, then the epoch is left
        reads.append(taken[0] - before)
        if split == "train" and len(firsts) == 1:
            saved = loader.state_dict()
    # The producer thread (torch resize) may have run ahead by its queue (the batch taken, one queued, one being
    # made: 3) and the last epoch's producer may finish the read it was in when stopped: 4 at most; the rest of
    # the epoch (5 more of 6 before) is never read.
    assert len(loader) >= 6 and all(n <= 4 for n in reads), reads
    if split == "val":  # val reads its part in order: every epoch starts at the same batch
        assert firsts[0] == firsts[1] == firsts[2]
        return
    assert firsts[0] != firsts[1] != firsts[2]  # each a new epoch, not epoch 0's order again
    assert saved["positions"][0]["done"] and saved["positions"][0]["early"]
    loader.close()  # its producer thread stops here, not while the resumed loader's reads are counted
    before = taken[0]
    resumed = backend.loader(LoaderSpec(split, size, limit_batches=1, resume=saved))
    assert next(iter(resumed))[1].tolist() == firsts[1]
    assert taken[0] - before <= 3  # the one taken, one queued, one being made; before: the saved batch made
    # again, then the epoch's 5 others run out
    again = backend.loader(LoaderSpec(split, size, limit_batches=1, resume=resumed.state_dict()))
    assert next(iter(again))[1].tolist() == firsts[2]


@pytest.mark.parametrize("checkpointing", ["true", "false"])
def test_a_resume_from_an_epoch_end_goes_on_with_the_next_epoch(folder: Path, checkpointing: str) -> None:
    """Lightning's last.ckpt at the end of epoch 0, resumed: the loader goes on with epoch 1. With DALI's reader
    positions, the uninterrupted run's epoch 1 itself; without them, a fresh loader of epoch 1 (its own order and
    seed), not epoch 0 again (its saved positions were empty, so the resume could not tell that the epoch had
    ended, and replayed epoch 0's order and draws)."""
    cfg = data_cfg(folder, f"data.dali_checkpointing={checkpointing}")
    loader = make_backend(cfg).loader(LoaderSpec("train", 4))
    batches = iter(loader)
    epoch0 = [next(batches)[1].tolist() for _ in range(len(loader))]  # as Lightning: len() batches
    state = loader.state_dict()
    epoch1 = [b[1].tolist() for b in loader]
    loader.close()
    resumed = make_backend(cfg).loader(LoaderSpec("train", 4, resume=state))
    again = [b[1].tolist() for b in resumed]
    resumed.close()
    if checkpointing == "true":
        assert epoch1 != epoch0 and again == epoch1
    else:
        fresh = make_backend(cfg).loader(LoaderSpec("train", 4, first_epoch=1))
        assert again != epoch0 and again == [b[1].tolist() for b in fresh]


@pytest.mark.slow
def test_the_epoch_after_one_left_early_does_not_depend_on_the_producer_thread(folder: Path) -> None:
    """limit_train_batches 5 of 6 with the torch resize: the producer thread reaches the reader's end (and counts
    the epoch) while the trainer validates. The next epoch is the one after the consumer's, as a resume from the
    saved position builds it: it was one further, skipping an epoch's order and draws, when the producer was done."""
    import time

    backend = make_backend(data_cfg(folder, "data.dali_train_resize=torch"))
    loader = backend.loader(LoaderSpec("train", 4, limit_batches=5))  # 24 images: 6 batches
    assert loader.prefetch == 1
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    state = loader.state_dict()
    deadline = time.monotonic() + 60  # bounds a hang only: the producer finishes the epoch's last batch
    while loader.epoch == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loader.epoch == 1  # the producer has counted the reader's epoch
    after = next(iter(loader))[1].tolist()
    loader.close()
    resumed = backend.loader(LoaderSpec("train", 4, limit_batches=5, resume=state))
    fresh = backend.loader(LoaderSpec("train", 4, first_epoch=1))
    assert after == next(iter(resumed))[1].tolist() == next(iter(fresh))[1].tolist()


def test_an_old_iterator_closed_late_leaves_the_next_epoch_running(folder: Path) -> None:
    """An epoch's iterator left after one batch and closed only after the next epoch's iterator began (a late
    garbage collection): the new epoch still gets all its batches. Closing the old one stopped the new producer,
    and the consumer waited for a batch forever."""
    import threading

    loader = make_backend(data_cfg(folder, "data.dali_train_resize=torch")).loader(LoaderSpec("train", 4))
    old = iter(loader)
    next(old)
    new = iter(loader)
    next(new)
    old.close()
    rest: list[int] = []
    reader = threading.Thread(target=lambda: rest.append(sum(1 for _ in new)), daemon=True)
    reader.start()
    reader.join(60)  # bounds a hang only
    assert rest == [len(loader) - 1]
    loader.close()


def test_resumed_data_module_builds_its_dali_pipeline_once_at_the_saved_batch(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed DataModule (a new process) builds the train pipeline at the saved position in its first build:
    one build, not a build thrown away for DaliLoader.restore's rebuild (6 s more for a 2-rank start measured
    by the startup benchmark), and it continues with the batch after the last one trained on."""
    from types import SimpleNamespace

    from imgcls.data.dali import backend as dali_backend
    from imgcls.data.datamodule import ClassificationDataModule

    cfg = data_cfg(folder)
    first = ClassificationDataModule(cfg, batch_size=4)
    first.trainer = SimpleNamespace(current_epoch=0, global_rank=0, world_size=1, limit_train_batches=1.0)
    batches = iter(first.train_dataloader())
    expected = [next(batches)[1].tolist() for _ in range(2)]
    saved = first.state_dict()  # after 2 of the epoch's 6 batches
    expected += [next(batches)[1].tolist()]
    first.train_dataloader().close()
    builds = []
    real = dali_backend._built
    monkeypatch.setattr(dali_backend, "_built", lambda *a, **k: builds.append(a) or real(*a, **k))
    resumed = ClassificationDataModule(cfg, batch_size=4)
    resumed.trainer = first.trainer
    resumed.load_state_dict(saved)
    loader = resumed.train_dataloader()
    assert loader is resumed.train_dataloader() and len(builds) == 1  # asked again (Lightning does): no rebuild
    assert next(iter(loader))[1].tolist() == expected[2]


def test_dali_list_file_is_imgcls_own_temp_file_and_only_it_goes(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DALI reads the names from a list file that imgcls makes in the temp dir for each build (train, val, a
    resumed build) and deletes right after: nothing else in the temp dir is touched, a file with the same prefix
    included, and nothing is written in the data root."""
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    theirs = {"imgcls-dali-theirs.txt": "a file with our prefix, not ours", "notes.txt": "keep me"}
    for name, text in theirs.items():
        (temp / name).write_text(text)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    data_before = {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")}
    backend = make_backend(data_cfg(folder))
    loader = backend.loader(LoaderSpec("train", 8))
    next(iter(loader))
    backend.loader(LoaderSpec("val", 4))
    backend.loader(LoaderSpec("train", 8, resume=loader.state_dict()))  # a resumed build
    assert {p.name: p.read_text() for p in temp.iterdir()} == theirs
    assert {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")} == data_before


@pytest.mark.parametrize("checkpointing", [True, False])
def test_dali_checkpointing_switch(folder: Path, checkpointing: bool) -> None:
    """data.dali_checkpointing=false (to save the reader's second copy of the names) keeps no reader position (a
    resume starts the reader's epoch again), only where the consumer is in its epoch. On, the position also names
    the DALI checkpoint of the batch trained on last."""
    loader = make_backend(data_cfg(folder, f"data.dali_checkpointing={checkpointing}")).loader(LoaderSpec("train", 8))
    next(iter(loader))
    position = loader.position()
    assert (position.get("yielded"), bool(position.get("start"))) == (1, checkpointing)


def test_yielded_batches_stay_valid_and_early_stop_restarts(folder: Path) -> None:
    loader = make_backend(data_cfg(folder)).loader(LoaderSpec("val", 4))
    iterator = iter(loader)
    first, _ = next(iterator)
    kept = first.clone()
    held = [next(iterator)[0] for _ in range(3)]  # Lightning holds a batch while it fetches the next
    assert torch.equal(first, kept)  # no later call overwrote it (DALI's executor or our copy)
    assert len({t.untyped_storage().data_ptr() for t in [first, *held]}) == 4
    # A new epoch after an early stop (limit_val_batches) is complete: every image once. (Its order
    # may be rotated: the unpadded reader wraps its last batch into the next epoch's first files.)
    images, labels = epoch(loader)
    assert sorted(labels.tolist()) == sorted(ImageFolder(str(folder / "val")).targets)
    assert all(any(torch.equal(image, other) for other in images) for image in kept)


@pytest.mark.slow
@pytest.mark.parametrize("split,resize", [("val", "dali"), ("train", "dali"), ("train", "torch")])
def test_channels_last_and_fp16_outputs(folder: Path, split: str, resize: str) -> None:
    """dali_cpu's batches leave the loader as uint8 (a quarter of float32's bytes to hold and copy) and are made
    float, or fp16 with data.dali_fp16, normalized and channels_last on the training device (on_device)."""
    extra = f"data.dali_train_resize={resize}"
    plain_backend = make_backend(data_cfg(folder, extra))
    nhwc_backend = make_backend(data_cfg(folder, extra, "precision.channels_last=true", "data.dali_fp16=true"))
    raw_x, _ = next(iter(plain_backend.loader(LoaderSpec(split, 4))))
    raw_y, _ = next(iter(nhwc_backend.loader(LoaderSpec(split, 4, 0, 1, 0))))
    assert raw_x.dtype == raw_y.dtype == torch.uint8 and torch.equal(raw_x, raw_y)  # same seed: same pixels
    # DALI's CMN writes NHWC for channels_last models; the torch resize writes NCHW (host_resize.py).
    assert raw_y.is_contiguous(memory_format=torch.channels_last if resize == "dali" else torch.contiguous_format)
    (x, _), (y, _) = plain_backend.on_device((raw_x, None)), nhwc_backend.on_device((raw_y, None))
    assert x.dtype == torch.float32 and y.dtype == torch.float16 and y.shape == x.shape == (4, 3, 32, 32)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y, x.to(torch.float16))  # the float32 normalization, rounded once to fp16


@pytest.mark.slow
@pytest.mark.parametrize("augment", ["autoaugment", "randaugment"])
def test_auto_augment_policies_run_on_cpu(folder: Path, augment: str) -> None:
    cfg = data_cfg(folder, f"recipe.augment={augment}", "data.hflip=0")
    images, labels = next(iter(make_backend(cfg).loader(LoaderSpec("train", 8))))
    assert images.shape == (8, 3, 32, 32) and torch.isfinite(images).all() and labels.dtype == torch.int64


@pytest.mark.parametrize("ops", ["pytorch", "tf2"])
def test_dali_auto_augment_translates_in_pixels_as_nvidia(
    folder: Path, monkeypatch: pytest.MonkeyPatch, ops: str
) -> None:
    """DALI's image_net policy is NVIDIA's v0; NVIDIA translates by up to 250 px (PYT IC/autoaugment.py:75, TF2
    dataloader/augment.py:757, DeepLearningExamples 729963dd). Given `shape`, DALI would shift up to the image. The
    policy takes the ops of data.autoaugment_ops (tf_autoaugment.py)."""
    from imgcls.data.dali import pipelines

    seen: list[dict] = []
    real = pipelines.v0_policy

    def spy(**kwargs):
        seen.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(pipelines, "v0_policy", spy)
    cfg = data_cfg(folder, "recipe.augment=autoaugment", "data.hflip=0", f"data.autoaugment_ops={ops}")
    images, _ = next(iter(make_backend(cfg).loader(LoaderSpec("train", 8))))
    assert seen and all(k == {"max_translate_abs": 250, "ops": ops} for k in seen)  # absolute pixels, not `shape`
    assert torch.isfinite(images).all()


@needs_cuda
def test_dali_gpu_matches_dali_cpu_on_val(folder: Path) -> None:
    cpu_x, cpu_y = epoch(make_backend(data_cfg(folder)).loader(LoaderSpec("val", 4)))
    gpu_x, gpu_y = epoch(make_backend(data_cfg(folder, "data.backend=dali_gpu")).loader(LoaderSpec("val", 4)))
    assert gpu_x.is_cuda and torch.equal(gpu_y, cpu_y)
    assert (gpu_x.cpu() - cpu_x).abs().mean() < 0.05  # nvJPEG vs libjpeg-turbo: small decode differences


@pytest.mark.slow
@pytest.mark.parametrize("resize", ["torch", "dali"])
def test_one_epoch_train_and_val(folder: Path, tmp_path: Path, resize: str) -> None:
    import imgcls.run.train

    overrides = tiny_overrides(
        folder, "data.backend=dali_cpu", "recipe.epochs=1", "recipe.warmup_epochs=0", f"data.dali_train_resize={resize}"
    )
    cfg = compose_config(overrides, run_dir=tmp_path)
    summary = imgcls.run.train.run(cfg)
    rows = read_report(tmp_path)["epochs"]
    assert len(rows) == 1 and rows[0]["step"] == 3  # 24 images / batch 8
    assert np.isfinite(summary["train.loss"]) and 0 <= summary["val.top1"] <= 100
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()


@pytest.fixture(scope="module")
def ddp_run(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("ddp")
    args = tiny_overrides(
        folder, "data.backend=dali_cpu", "data.batch_size=4", "recipe.epochs=1", "recipe.warmup_epochs=0",
        "data.dali_train_resize=torch", "trainer.devices=2", "trainer.accelerator=cpu",
        f"data.trace_dir={run_dir}/trace", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    result = run_cli("train.py", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_ddp_ranks_read_distinct_parts(ddp_run: Path) -> None:
    trace = ddp_run / "trace"
    train = [set(map(int, (trace / f"train_rank{r}_epoch0.txt").read_text().split())) for r in range(2)]
    assert len(train[0]) == len(train[1]) == 12 and not train[0] & train[1] and train[0] | train[1] == set(range(24))
    val = [(trace / f"val_rank{r}_epoch0.txt").read_text().split() for r in range(2)]
    assert sorted(map(int, val[0] + val[1])) == list(range(21))  # uneven parts 10 + 11, no padding
    assert read_report(ddp_run)["epochs"][0]["step"] == 3  # 12 images a rank / batch 4


@pytest.mark.slow
def test_val_top1_same_for_one_and_two_processes(ddp_run: Path, folder: Path, tmp_path: Path) -> None:
    """The 2-process run validated its final weights on uneven parts (10 + 11 images); evaluating the
    same weights (last.ckpt, saved after that validation) in one process must give the same numbers."""
    two = read_report(ddp_run)["epochs"][-1]
    out = tmp_path / "eval.json"
    args = [
        f"ckpt={ddp_run}/checkpoints/last.ckpt", f"data.root={folder}", "data.backend=dali_cpu", "data.batch_size=4",
        "trainer.devices=1", "trainer.accelerator=cpu", f"output={out}", f"hydra.run.dir={tmp_path}",
    ]  # fmt: skip
    result = run_cli("evaluate.py", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    one = json.loads(out.read_text())
    assert one["val.top1"] == pytest.approx(two["val.top1"], abs=1e-4)
    assert one["val.loss"] == pytest.approx(two["val.loss"], rel=1e-4)


@pytest.mark.slow
def test_dali_run_stopped_mid_epoch_resumes_at_the_exact_batch(tmp_path: Path) -> None:
    """A dali_cpu run stopped mid-epoch (SIGTERM saves last.ckpt at the next optimizer step) resumes at the saved
    batch from DALI's reader checkpoint: the rest of the epoch is the same samples with the same augmentation, and
    the final weights equal an uninterrupted run's, bitwise. Before, the DALI loader kept no position: the epoch's
    rest was drawn from a fresh pass over the rank's part. With the torch resize, whose background thread takes
    batches from DALI ahead of the trainer (the DALI resize at this size: the kill tests). The signal is sent while
    the run waits after its first last.ckpt (tests/train_until_signalled.py), not after a race against its steps:
    the save is at step 3 on any machine."""
    train_resize = "torch"
    import signal
    import time

    from tests.conftest import ROOT

    data = make_image_folder(tmp_path / "data", classes=3, train_per_class=16, val_per_class=2)
    args = tiny_overrides(
        data, "data.backend=dali_cpu", "recipe.epochs=2", "recipe.warmup_epochs=0",
        "callbacks.checkpoint.every_n_train_steps=2", f"data.dali_train_resize={train_resize}",
    )  # fmt: skip  # 48 images / batch 8 = 6 steps per epoch
    full = run_cli("train.py", *args, f"hydra.run.dir={tmp_path / 'full'}", f"data.trace_dir={tmp_path / 'tf'}")
    assert full.returncode == 0, full.stderr[-2000:]

    run_dir = tmp_path / "split"
    marker = tmp_path / "waiting"  # the run waits after its 1st last.ckpt (step 2) until the signal has arrived
    proc = warm_python.start(
        [ROOT / "tests" / "train_until_signalled.py", marker, "1", *args, f"hydra.run.dir={run_dir}",
         f"data.trace_dir={tmp_path / 'ts'}"],
        env={"WANDB_MODE": "offline"},
    )  # fmt: skip
    deadline = time.monotonic() + 300  # bounds a hang only
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM, proc.stderr.read()[-2000:]
    last = run_dir / "checkpoints" / "last.ckpt"
    stopped = torch.load(last, map_location="cpu", weights_only=False)
    assert stopped["global_step"] == 3  # saved at the step after the one it waited at: inside epoch 0 (6 steps)

    resumed = run_cli(
        "train.py", *args, f"hydra.run.dir={run_dir}", "ckpt_path=last", f"data.trace_dir={tmp_path / 'ts'}"
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = read_report(tmp_path / "full")["epochs"], read_report(run_dir)["epochs"]
    assert [(r["epoch"], r["step"]) for r in b] == [(r["epoch"], r["step"]) for r in a] == [(0, 6), (1, 12)]
    ref = torch.load(tmp_path / "full" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    end = torch.load(last, map_location="cpu", weights_only=False)
    for key, value in ref["state_dict"].items():
        assert torch.equal(value, end["state_dict"][key]), key
    # The reader read the same files in the same order, the stopped epoch's rest included.
    for epoch in (0, 1):
        name = f"train_rank0_epoch{epoch}.txt"
        assert (tmp_path / "ts" / name).read_text() == (tmp_path / "tf" / name).read_text(), epoch


@pytest.mark.slow
def test_dali_run_with_limited_epochs_resumes_at_the_next_epoch_as_an_uninterrupted_run(tmp_path: Path) -> None:
    """trainer.limit_train_batches=2 of 6: a run stopped after epoch 0 (trainer.max_epochs=1) and resumed with
    ckpt_path=last trains epochs 1-2 on the same files in the same order, to bitwise the same weights, as a run of
    3 epochs; each epoch after the first starts a new pipeline instead of decoding the rest of the last."""
    data = make_image_folder(tmp_path / "data", classes=3, train_per_class=16, val_per_class=2)
    args = tiny_overrides(
        data, "data.backend=dali_cpu", "recipe.epochs=3", "recipe.warmup_epochs=0", "trainer.limit_train_batches=2",
        "data.dali_train_resize=torch",
    )  # fmt: skip  # 48 images / batch 8 = 6 batches, 2 taken per epoch
    full = run_cli("train.py", *args, f"hydra.run.dir={tmp_path / 'full'}", f"data.trace_dir={tmp_path / 'tf'}")
    assert full.returncode == 0, full.stderr[-2000:]
    run_dir, trace = tmp_path / "split", f"data.trace_dir={tmp_path / 'ts'}"
    first = run_cli("train.py", *args, f"hydra.run.dir={run_dir}", trace, "trainer.max_epochs=1")
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = run_cli("train.py", *args, f"hydra.run.dir={run_dir}", trace, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert [r["step"] for r in read_report(run_dir)["epochs"]] == [2, 4, 6]
    ref = torch.load(tmp_path / "full" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    end = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    for key, value in ref["state_dict"].items():
        assert torch.equal(value, end["state_dict"][key]), key
    names = [f"train_rank0_epoch{epoch}.txt" for epoch in range(3)]
    orders = [(tmp_path / "tf" / name).read_text().split() for name in names]
    assert [(tmp_path / "ts" / name).read_text().split() for name in names] == orders
    # Only what the trainer took (and the producer's queue ahead of it) was read: 16 of 48 files, not the rest.
    assert all(16 <= len(order) <= 32 for order in orders) and len({tuple(o) for o in orders}) == 3


# --- the torch resize in a background thread (data.dali_host_prefetch) ----------------------------------------


def _counting_resize(monkeypatch: pytest.MonkeyPatch, fail_at: int | None = None) -> list[str]:
    """Patch HostResize to record the thread of each finished resize (and to fail at call FAIL_AT)."""
    import threading

    from imgcls.data.dali.host_resize import HostResize

    real, threads = HostResize.__call__, []

    def call(self, crops, mirror):  # noqa: ANN001, ANN202
        if fail_at is not None and len(threads) + 1 == fail_at:
            threads.append("failed")
            raise RuntimeError("resize failed on purpose")
        out = real(self, crops, mirror)
        threads.append(threading.current_thread().name)
        return out

    monkeypatch.setattr(HostResize, "__call__", call)
    return threads


def test_host_resize_makes_the_next_batch_while_the_step_runs(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Structural, not timed: while the consumer holds batch 1 without asking for more, batch 2 (and no
    more than prefetch + 1 ahead) gets resized, in another thread. A synchronous resize makes none."""
    import threading
    import time

    threads = _counting_resize(monkeypatch)
    loader = make_backend(data_cfg(folder, "data.dali_train_resize=torch")).loader(LoaderSpec("train", 4))
    assert loader.prefetch == 1
    iterator = iter(loader)
    next(iterator)
    deadline = time.monotonic() + 30
    while len(threads) < 3 and time.monotonic() < deadline:  # batch 2 in the queue, batch 3 made
        time.sleep(0.01)
    time.sleep(0.2)  # and then it waits: the queue is bounded
    assert len(threads) == 3
    assert threading.current_thread().name not in threads and set(threads) == {"imgcls-dali-host"}
    assert len(list(iterator)) == len(loader) - 1 == 5  # 24 images, batch 4: the rest of the epoch


def test_background_resize_error_reaches_the_consumer(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    threads = _counting_resize(monkeypatch, fail_at=3)
    loader = make_backend(data_cfg(folder, "data.dali_train_resize=torch")).loader(LoaderSpec("train", 4))
    got = []
    with pytest.raises(RuntimeError, match="resize failed on purpose"):
        for batch in loader:
            got.append(batch)
    assert len(got) == 2 and threads[2] == "failed"  # batches before the failure arrive, then the error
    monkeypatch.undo()
    images, labels = epoch(loader)  # the next epoch is whole: the failed one was run out
    assert len(labels) == 24 and sorted(labels.tolist()) == sorted(ImageFolder(str(folder / "train")).targets)


@pytest.mark.slow
def test_background_resize_keeps_traces_early_stops_and_ends_its_thread(folder: Path, tmp_path: Path) -> None:
    import gc
    import threading
    import time

    """Against the synchronous loader (data.dali_host_prefetch=0): the same batches, the same trace files,
    also across an early stop with the abandoned iterator still alive; a dropped loader ends its thread."""
    runs = {}
    for prefetch in (0, 1):
        trace = tmp_path / f"prefetch{prefetch}"
        overrides = ("data.dali_train_resize=torch", f"data.trace_dir={trace}", f"data.dali_host_prefetch={prefetch}")
        loader = make_backend(data_cfg(folder, *overrides)).loader(LoaderSpec("train", 4))
        assert (loader._worker is not None) == bool(prefetch)
        iterator = iter(loader)
        # An early stop (limit_train_batches) after 2 batches, kept (cloned: the ring of batch buffers rewrites
        # a batch once the consumer has moved past it, loader.ring_slots) to compare after two more epochs.
        first = [tuple(t.clone() for t in next(iterator)) for _ in range(2)]
        second = [y for _, y in loader]  # a new epoch while the first iterator is still alive
        del iterator
        third = [y for _, y in loader]
        runs[prefetch] = (first, second, third, sorted(trace.iterdir()))
    sync, background = runs[0], runs[1]
    for a, b in zip(sync[0], background[0]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # the same pixels, the same order
    assert [y.tolist() for y in sync[1]] == [y.tolist() for y in background[1]]
    assert [y.tolist() for y in sync[2]] == [y.tolist() for y in background[2]]
    assert [p.name for p in sync[3]] == [p.name for p in background[3]]
    assert [p.read_text() for p in sync[3]] == [p.read_text() for p in background[3]]
    del loader, runs, sync, background
    gc.collect()
    deadline = time.monotonic() + 10
    while any(t.name == "imgcls-dali-host" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "imgcls-dali-host" for t in threading.enumerate())


def _consume_holding_one(loader, wait: float, epochs: int = 2, stop_at_overwrite: bool = False) -> tuple[bool, set]:
    """Iterate as Lightning does: the batch before stays in use while the next one is asked for. Whether a batch in
    use was written again (within WAIT seconds of asking for the next one), and the buffers the batches used."""
    import time

    held = kept = None
    overwritten, buffers = False, set()
    for _ in range(epochs):
        for x, _ in loader:
            if held is not None:
                deadline = time.monotonic() + wait  # time for the producer to run ahead as far as it may
                while torch.equal(held, kept) and time.monotonic() < deadline:
                    time.sleep(0.01)
                overwritten |= not torch.equal(held, kept)
                if overwritten and stop_at_overwrite:
                    return overwritten, buffers
            buffers.add(x.untyped_storage().data_ptr())
            held, kept = x, x.clone()
    return overwritten, buffers


@pytest.mark.slow
@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_host_resize_ring_keeps_the_batch_in_use_and_bounds_memory(folder: Path, prefetch: int) -> None:
    """The torch resize writes into a ring of loader.ring_slots(prefetch) buffers: over two epochs (6 batches
    each) the batch the consumer still uses while it asks for the next is never written again, and exactly that
    many buffers are used. One slot fewer, and a batch in use is overwritten: the size is no larger than needed."""
    from imgcls.data.dali.batch_ring import BatchRing
    from imgcls.data.dali.loader import ring_slots

    cfg = data_cfg(folder, "data.dali_train_resize=torch", f"data.dali_host_prefetch={prefetch}")
    loader = make_backend(cfg).loader(LoaderSpec("train", 4))
    slots = ring_slots(prefetch)
    assert loader.prefetch == prefetch and loader.host_resize.ring.slots == slots == prefetch + 2 + (prefetch > 0)
    overwritten, buffers = _consume_holding_one(loader, wait=0.1)
    assert not overwritten and len(buffers) == slots and loader.host_resize.ring.taken == 12

    smaller = make_backend(cfg).loader(LoaderSpec("train", 4))
    smaller.host_resize.ring = BatchRing(slots - 1)  # past the check DaliLoader makes (test below)
    overwritten, _ = _consume_holding_one(smaller, wait=10, stop_at_overwrite=True)
    assert overwritten


def test_loader_refuses_a_ring_too_small_for_its_queue() -> None:
    from types import SimpleNamespace

    from imgcls.data.dali.batch_ring import BatchRing
    from imgcls.data.dali.loader import DaliLoader, ring_slots
    from imgcls.data.dali.settings import DaliSettings

    settings = DaliSettings.from_config(data_cfg(Path("/unused")), gpu=False)
    for prefetch in (0, 1, 3):
        resize = SimpleNamespace(ring=BatchRing(ring_slots(prefetch) - 1))
        with pytest.raises(ValueError, match=f"needs {ring_slots(prefetch)}"):
            spec, queued = LoaderSpec("train", 4), replace(settings, host_prefetch=prefetch)
            DaliLoader(None, ["data"], range(8), spec, queued, host_resize=resize)


def test_batch_ring_hands_out_its_slots_in_turn() -> None:
    from imgcls.data.dali.batch_ring import BatchRing

    ring = BatchRing(3)
    first = [ring.take((4, 3, 8, 8), torch.float32) for _ in range(3)]
    assert len({t.data_ptr() for t in first}) == 3
    again = ring.take((4, 3, 8, 8), torch.float32)
    assert again.data_ptr() == first[0].data_ptr() and again.shape == (4, 3, 8, 8)
    short = ring.take((2, 3, 8, 8), torch.float32)  # a batch a bad file left short: the slot's first rows
    assert short.data_ptr() == first[1].data_ptr() and short.shape == (2, 3, 8, 8)
    resized = ring.take((4, 3, 16, 16), torch.float32)  # another image size: a new buffer for the slot
    assert resized.shape == (4, 3, 16, 16) and ring.buffers[2].shape == (4, 3, 16, 16)
    assert ring.take((4, 3, 8, 8), torch.float16).dtype == torch.float16
    with pytest.raises(ValueError):
        BatchRing(0)


class _ShutdownFailsOnce:
    """DALI's backend pipeline, whose first Shutdown raises (as one does when a batch failed after the consumer
    stopped taking them); DALI's Pipeline.__del__ then left it running, to be destroyed later holding the GIL."""

    def __init__(self, backend) -> None:
        self.backend, self.calls = backend, 0

    def Shutdown(self) -> None:  # noqa: N802 - DALI's name
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a prefetched batch failed")
        self.backend.Shutdown()

    def __getattr__(self, name: str):
        return getattr(self.backend, name)


@pytest.mark.parametrize("prefetch", [0, 1])
@pytest.mark.parametrize("how", ["close", "drop"])
def test_a_closed_or_dropped_loader_stops_its_pipeline(
    folder: Path, monkeypatch: pytest.MonkeyPatch, how: str, prefetch: int
) -> None:
    """The executor is stopped by the loader (with DALI's shutdown, which releases the GIL), retried when it
    raises, and never left to be destroyed where the last reference goes: a suite run hung for good when a
    pipeline whose __del__ had raised was freed while its fn.python_function waited for the GIL."""
    import gc
    import sys
    import time

    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    overrides = ("data.dali_train_resize=torch", f"data.dali_host_prefetch={prefetch}")
    loader = make_backend(data_cfg(folder, *overrides)).loader(LoaderSpec("train", 4))
    next(iter(loader))  # mid-epoch: batches in flight
    pipe = loader._iterator._pipes[0]
    fails_once = pipe._pipe = _ShutdownFailsOnce(pipe._pipe)
    if how == "close":
        loader.close()
    else:
        del loader
        gc.collect()
    deadline = time.monotonic() + 10  # a dropped loader's worker thread shuts the pipeline down after its task
    while pipe._pipe is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pipe._pipe is None, "the pipeline's executor is still running"
    assert fails_once.calls == 2 and not unraisable


def test_a_loaders_pipeline_is_shut_down_in_imgcls_thread_not_the_callers() -> None:
    """A loader's finalizer runs in whatever thread collects it, DALI's executor threads included (they run the
    bad-image check's Python); shutting a pipeline down there makes the thread join itself (std::terminate,
    "Resource deadlock avoided", seen in a suite run). The shutdown is handed to imgcls's own thread."""
    import threading

    from imgcls.data.dali.loader import _release

    class Pipe:
        def __init__(self) -> None:
            self._pipe, self.thread = object(), None

        def _shutdown(self) -> None:
            self.thread, self._pipe = threading.current_thread().name, None

    pipe = Pipe()
    _release([pipe], None).result(timeout=10)
    assert pipe.thread == "imgcls-dali-shutdown" and pipe._pipe is None


def test_prefetch_factor_null_is_the_default_queue_depth() -> None:
    from imgcls.data.dali.settings import DaliSettings

    unset = DaliSettings.from_config(data_cfg(Path("/unused"), "data.prefetch_factor=null"), gpu=False)
    assert unset.prefetch_queue_depth == 2
    deep = DaliSettings.from_config(data_cfg(Path("/unused"), "data.prefetch_factor=4"), gpu=False)
    assert deep.prefetch_queue_depth == 4
