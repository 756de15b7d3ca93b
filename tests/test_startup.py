"""dali_cpu's startup: no file is opened before training (docs/data-backends.md "Startup"), and the startup benchmark
(`python -m imgcls.bench.startup`) builds its hard-linked tree only inside its own folder and measures
real train.py starts, a first one and a resumed one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

from imgcls.bench import startup
from imgcls.data.backends import make_backend
from imgcls.data.protocol import LoaderSpec
from tests.conftest import compose_config, make_image_folder, tiny_overrides
from tests.file_opens import FileOpens

pytest.importorskip("nvidia.dali")


def _count_checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every structural check of a file (image_scan.scan_file / scan_bytes), wherever it is imported: before
    training or as DALI reads it."""
    from imgcls.data import file_list, image_scan
    from imgcls.data.dali import pipelines, records

    calls: list[str] = []
    checks = (
        (image_scan, "scan_file"), (image_scan, "scan_bytes"), (file_list, "scan_file"), (pipelines, "scan_bytes"),
        (records, "scan_bytes"),
    )  # fmt: skip
    for module, name in checks:
        real = getattr(module, name, None)
        if real is not None:

            def counting(data: object, *args: object, _real=real, _name=name, **kwargs: object) -> object:
                calls.append(_name)
                return _real(data, *args, **kwargs)

            monkeypatch.setattr(module, name, counting)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("start", ["first", "resumed"])
def test_dali_start_opens_only_the_files_of_its_first_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str
) -> None:
    """A start (first, or a resume: a new process builds the same backend again) checks the files DALI reads
    for its first batches, not all 240 train files. Before the fix every file was scanned at every start."""
    root = make_image_folder(tmp_path / "data", classes=12, train_per_class=20, val_per_class=1)
    cfg = compose_config(tiny_overrides(root, "data.backend=dali_cpu", "data.num_workers=1")).data
    if start == "resumed":  # the first start's backend and loader, stopped as in a process that ended
        first = make_backend(cfg).loader(LoaderSpec("train", 8))
        next(iter(first))
        first.close()  # else its prefetching pipeline can still be checking files once counting starts (CI: 40)
    calls = _count_checks(monkeypatch)
    loader = make_backend(cfg).loader(LoaderSpec("train", 8))
    images, labels = next(iter(loader))
    assert len(labels) == 8
    prefetch = int(cfg.prefetch_factor)
    assert 8 <= len(calls) <= 8 * (prefetch + 2) < 240


def test_file_list_is_imagefolders(tmp_path: Path) -> None:
    """The compact file list walks the folders as torchvision's make_dataset: same files, order, classes."""
    from imgcls.data.file_list import FileList

    root = make_image_folder(tmp_path / "data", classes=3, train_per_class=3, val_per_class=1)
    (root / "train" / "class_1" / "nested" / "deeper").mkdir(parents=True)
    (root / "train" / "class_1" / "nested" / "deeper" / "b.JPG").write_bytes(b"")
    (root / "train" / "class_1" / "a b.png").write_bytes(b"")
    (root / "train" / "class_1" / "notes.txt").write_text("not an image")
    classes = ["class_0", "class_1", "class_2"]
    files = FileList(root / "train", classes)
    expected = make_dataset(str(root / "train"), {c: i for i, c in enumerate(classes)}, extensions=IMG_EXTENSIONS)
    assert [(files.path(i), int(files.targets[i])) for i in range(len(files))] == expected
    listing = tmp_path / "list.txt"
    files.write_list(str(listing))
    lines = listing.read_text().splitlines()
    assert lines[4] == f"{os.path.relpath(expected[4][0], root / 'train')} 4" and len(lines) == len(expected)


def _snapshot(folder: Path, skip: Path) -> dict[str, tuple[int, int]]:
    """Every path outside `skip`, with size and mtime for files (a folder's mtime changes with its entries)."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (0, 0)
        for p in folder.rglob("*")
        if skip not in p.parents and p != skip
    }


@pytest.mark.slow
def test_benchmark_builds_its_tree_in_its_own_folder_and_times_both_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    source = make_image_folder(tmp_path / "photos", classes=2, train_per_class=3, val_per_class=1, size=(96, 80))
    (tmp_path / "user-file.txt").write_text("keep me")
    bench = tmp_path / "cache" / "bench"
    bench.parent.mkdir()
    before = _snapshot(tmp_path, bench)
    out = tmp_path / "rows.json"
    startup.main([str(source), "--classes", "4", "--train", "16", "--val", "2", "--dir", str(bench),
                  "--backends", "dali_cpu", "--image-size", "32", "--batch-size", "8", "--workers", "1",
                  "--json", str(out), "--no-disk-warmup",  # this test process has imported them
                  "model.arch=test_resnet", "callbacks.charts=false"])  # the mechanics, not the numbers  # fmt: skip
    printed = capsys.readouterr().out
    assert _snapshot(tmp_path, bench) == {**before, str(out): _snapshot(tmp_path, bench)[str(out)]}
    tree = bench / "tree"
    train = sorted((tree / "train").rglob("*.jpg"))
    assert len(train) == 64 and len(list((tree / "val").rglob("*.jpg"))) == 8
    sources = {p.stat().st_ino for p in source.rglob("*.jpg")}
    assert {p.stat().st_ino for p in train} <= sources  # hard links: no copied image data
    rows = json.loads(out.read_text())
    assert [(r["backend"], r["start"]) for r in rows] == [("dali_cpu", "first"), ("dali_cpu", "resumed")]
    for row in rows:
        assert 0 < row["first_step_s"] <= row["exit_s"] and row["peak_rss_mib"] > 100
        assert len(row["peak_each_rank_mib"]) == 1
    assert "| dali_cpu | resumed |" in printed
    # The resumed start continued the first one's run: its checkpoint is from step 2.
    ckpt = torch.load(bench / "runs" / "dali_cpu" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 2


RANK_TREE = """
import os, subprocess, sys, time
if sys.argv[1] == "rank0":  # as Lightning's launcher: rank 1 is a new process with another command line
    subprocess.Popen([sys.executable, __file__, "rank1"])
if os.fork() == 0:  # a loader worker: forked, its parent's command line
    time.sleep(30)
    os._exit(0)
time.sleep(30)
"""


def test_startup_benchmark_tells_ranks_from_their_loader_workers(tmp_path: Path) -> None:
    """--devices 2: the memory per rank is a rank's process plus its forked workers, where a rank started by
    Lightning's launcher is a process whose command line differs from its parent's."""
    script = tmp_path / "tree.py"
    script.write_text(RANK_TREE)
    root = subprocess.Popen([sys.executable, str(script), "rank0"])
    try:
        deadline = time.monotonic() + 20
        while len(startup._tree_pids(root.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = startup._tree(root.pid)
        assert len(tree) == 4  # rank 0, its worker, rank 1, its worker
        ranks = startup._ranks_memory_kib(tree)
        assert len(ranks) == 2 and min(ranks) > 1000, ranks  # each: a Python's RSS plus a worker's private pages
    finally:
        for pid in reversed(startup._tree_pids(root.pid)):
            os.kill(pid, signal.SIGKILL)
        root.wait()


def test_benchmark_refuses_a_folder_it_did_not_make(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = make_image_folder(tmp_path / "photos", classes=1, train_per_class=1, val_per_class=1)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit) as exit_info:
        startup.main([str(source), "--classes", "1", "--train", "1", "--val", "1", "--dir", str(theirs)])
    assert exit_info.value.code == 2
    assert "not made by this benchmark" in capsys.readouterr().err
    assert [p.name for p in theirs.iterdir()] == ["precious.txt"]


def test_rebuilding_the_tree_with_other_sizes_removes_only_its_links(tmp_path: Path) -> None:
    """A stale tree (other sizes) is deleted and rebuilt; the photos it linked to are untouched."""
    source = make_image_folder(tmp_path / "photos", classes=2, train_per_class=2, val_per_class=1)
    originals = {str(p): p.read_bytes() for p in source.rglob("*.jpg")}
    bench = tmp_path / "bench"
    tree = startup.build_tree(source, bench, classes=3, train=4, val=1)
    assert len(list(tree.rglob("*.jpg"))) == 15
    tree = startup.build_tree(source, bench, classes=2, train=2, val=1)
    assert len(list(tree.rglob("*.jpg"))) == 6
    assert {str(p): p.read_bytes() for p in source.rglob("*.jpg")} == originals
    assert all(p.stat().st_nlink >= 1 for p in source.rglob("*.jpg"))


# --- dali_cpu's memory at start (docs/data-backends.md "Startup": what was removed and why) ------------------


@pytest.mark.slow
def test_train_reader_holds_no_shuffle_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The train reader reshuffles the whole list every epoch (shuffle_after_epoch) instead of drawing from
    a buffer of `initial_fill` encoded files (random_shuffle): building the loader, which runs its first
    batches, reads a few batches' files, not 1,024 of them (110 MB per rank on ImageNet before)."""
    from nvidia.dali import fn

    root = make_image_folder(tmp_path / "data", classes=4, train_per_class=75, val_per_class=1, size=(160, 120))
    cfg = compose_config(tiny_overrides(root, "data.backend=dali_cpu", "data.num_workers=1")).data
    backend = make_backend(cfg)
    next(iter(backend.loader(LoaderSpec("val", 8))))  # DALI's first pipeline: imports done
    given: list[dict] = []
    reader = fn.readers.file

    def recording(*args: object, **kwargs: object) -> object:
        given.append(kwargs)
        return reader(*args, **kwargs)

    monkeypatch.setattr(fn.readers, "file", recording)
    with FileOpens(root / "train") as opens:
        loader = backend.loader(LoaderSpec("train", 8))
        read = len(opens.names())
    assert given[0]["shuffle_after_epoch"] is True and not given[0].get("random_shuffle")
    assert 8 <= read < 8 * (int(cfg.prefetch_factor) + 4) < 300, read  # (of 300 files)
    images, labels = next(iter(loader))
    assert len(labels) == 8


@pytest.mark.slow
def test_train_epochs_are_fresh_permutations_of_the_run_seed(tmp_path: Path) -> None:
    """Every epoch reads each file once over the ranks, in a new order; the order follows the run seed
    (the list is handed to DALI permuted by it) and is the same for the same seed."""
    root = make_image_folder(tmp_path / "data", classes=3, train_per_class=8, val_per_class=1)
    orders = {}
    for seed in (0, 1):
        trace = tmp_path / f"seed{seed}"
        cfg = compose_config(tiny_overrides(root, "data.backend=dali_cpu", f"data.trace_dir={trace}")).data
        backend = make_backend(cfg)
        for rank in range(2):
            loader = backend.loader(LoaderSpec("train", 4, rank, 2, seed=seed))
            for _ in range(3):
                list(loader)
        orders[seed] = [
            sum(((trace / f"train_rank{r}_epoch{e}.txt").read_text().split() for r in range(2)), []) for e in range(3)
        ]
        for order in orders[seed]:
            assert sorted(map(int, order)) == list(range(24))  # 2 ranks x 3 batches of 4: every file once
        assert len({tuple(order) for order in orders[seed]}) == 3
    assert orders[0] != orders[1]
    cfg = compose_config(tiny_overrides(root, "data.backend=dali_cpu", f"data.trace_dir={tmp_path / 'again'}")).data
    again = make_backend(cfg)
    list(again.loader(LoaderSpec("train", 4, 0, 2, seed=0)))
    assert (tmp_path / "again" / "train_rank0_epoch0.txt").read_text().split() == orders[0][0][:12]


@pytest.mark.slow
def test_file_list_keeps_its_names_compressed(tmp_path: Path) -> None:
    """DALI holds its own copy of the names: the FileList keeps them compressed (a few bytes a file, not
    the 40 of one uncompressed byte string), and still gives every path, label and list line."""
    import tracemalloc

    import numpy as np

    from imgcls.data.file_list import FileList

    classes = [f"n{c:08d}" for c in range(3)]
    for c in classes:
        (tmp_path / c).mkdir()
        for i in range(3000):
            (tmp_path / c / f"{c}_{i:05d}.JPEG").touch()
    tracemalloc.start()
    try:
        files = FileList(tmp_path, classes)
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept / len(files) < 10
    expected = make_dataset(str(tmp_path), {c: i for i, c in enumerate(classes)}, extensions=IMG_EXTENSIONS)
    assert [(files.path(i), int(files.targets[i])) for i in range(len(files))] == expected
    assert files.labels(torch.tensor([0, 2999, 3000, 8999])).tolist() == [0, 0, 1, 2]
    order = np.random.default_rng(0).permutation(len(files))
    listing = tmp_path / "list.txt"
    files.write_list(str(listing), order=order)
    lines = listing.read_text().splitlines()
    line = [f"{os.path.relpath(path, tmp_path)} {i}" for i, (path, _) in enumerate(expected)]
    assert lines == [line[i] for i in order]
    files.write_list(str(listing), 4000, 4100)
    assert listing.read_text().splitlines() == line[4000:4100]


@pytest.mark.slow
def test_host_resize_reuses_released_batches_and_leaves_malloc_alone(tmp_path: Path) -> None:
    """dali_cpu writes each batch into a ring of buffers (no fresh, page-faulting memory per batch) that the
    loader's queue sizes: a batch is written again only after the consumer has moved past it
    (loader.ring_slots), never while the consumer still uses it, and the memory is that ring's. And it no
    longer tunes glibc for the whole process: a block the training step frees goes back to the system.
    Before, mallopt kept every freed block (90 MB more at the first step's peak on the startup benchmark).
    In a subprocess: malloc settings are per process."""
    import subprocess
    import sys

    root = make_image_folder(tmp_path / "data", classes=2, train_per_class=32, val_per_class=1, size=(96, 80))
    script = f"""
import time
import torch
from imgcls.data.backends import make_backend
from imgcls.data.dali.loader import ring_slots
from imgcls.data.protocol import LoaderSpec
from tests.conftest import compose_config, tiny_overrides
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
cfg = compose_config(tiny_overrides({str(root)!r}, "data.backend=dali_cpu", "data.dali_train_resize=torch",
                                    "model.image_size=64")).data
loader = make_backend(cfg).loader(LoaderSpec("train", 4))
ring = loader.host_resize.ring
assert ring.slots == ring_slots(loader.prefetch) == 4, ring.slots
batches = iter(loader)
held, _ = next(batches)
kept = held.clone()
seen = {{held.data_ptr()}}
for i in range(1, 13):
    x, _ = next(batches)  # as Lightning asks for the next batch: the one before is still in use
    deadline = time.monotonic() + 10
    while ring.taken < i + 3 and time.monotonic() < deadline:  # the queue's batch, then the one after it
        time.sleep(0.005)
    time.sleep(0.05)  # that last one written in full
    assert ring.taken == i + 3, ring.taken
    assert torch.equal(held, kept), f"batch {{i - 1}}, still in use, was written again"
    seen.add(x.data_ptr())
    held, kept = x, x.clone()
    del x
assert len(seen) == ring.slots, seen
before = rss()
block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MB, written: resident
grown = rss() - before
del block
print(grown, rss() - before)
"""
    command = [sys.executable, "-c", script]
    result = subprocess.run(command, cwd=startup.REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    grown, left = map(int, result.stdout.split()[-2:])
    assert grown > 60 << 20 and left < 8 << 20


@pytest.mark.slow
def test_stages_prints_each_milestone_of_a_start(tmp_path: Path) -> None:
    """`python -m imgcls.bench.stages` (where a start's memory goes, docs/data-backends.md "Startup") runs the
    startup benchmark's train.py start in-process and prints one row per milestone."""
    import subprocess
    import sys

    source = make_image_folder(tmp_path / "photos", classes=2, train_per_class=2, val_per_class=1, size=(96, 80))
    sizes = "--classes 2 --train 8 --val 1 --image-size 32 --batch-size 4 --workers 1".split()
    sizes += ["model.arch=test_resnet", "callbacks.charts=false"]  # the milestones, not resnet18's numbers
    command = [sys.executable, "-m", "imgcls.bench.stages", str(source), "--dir", str(tmp_path / "bench"), *sizes]
    result = subprocess.run(command, cwd=startup.REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split(" | ")[0].lstrip("| ") for line in result.stdout.splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        "imports", "file list (16 files)", "loader built (DALI ran its first batch)", "first batch in the step",
        "first forward", "first backward", "first step done", "end",
    ]  # fmt: skip


RANK_SCRIPT = """
import json, sys
import torch.distributed as dist
sys.path.insert(0, {repo!r})
from imgcls.data.backends import make_backend
from imgcls.data.file_list import FileList
from imgcls.errors import DataError
from tests.conftest import compose_config, tiny_overrides

walks = []
walk = FileList.__init__
def counting(self, split_root, classes):
    walks.append(str(split_root))
    walk(self, split_root, classes)
FileList.__init__ = counting

dist.init_process_group("gloo")
backend = make_backend(compose_config(tiny_overrides({root!r}, "data.backend={backend}")).data)
split_files = backend.files if {backend!r} != "torchvision" else lambda split: backend.dataset(split).files
files = split_files("train")
row = {{"paths": [files.path(i) for i in range(len(files))], "targets": files.targets.tolist()}}
try:
    split_files("val")
except DataError as exc:
    row["val"] = str(exc)
row["walks"] = walks
with open(sys.argv[1], "w") as out:
    json.dump(row, out)
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["dali_cpu", "torchvision"])
def test_one_rank_lists_the_folder_and_the_others_receive_it(tmp_path: Path, backend: str) -> None:
    """Under DDP only rank 0 walks a split's tree (1.33M entries on ImageNet: every rank walking it multiplied the
    load on shared storage and the start time); the others receive its list, the same files and labels as a walk
    of their own. A failure of the walk reaches every rank as the same one-line error instead of a hang.
    torchvision: its dataset reads the received list (before, every rank's ImageFolder walked the tree)."""
    from imgcls.data.file_list import FileList
    from tests.conftest import ROOT, run_two_gloo_ranks

    root = make_image_folder(tmp_path / "data", classes=3, train_per_class=5, val_per_class=1)
    for image in (root / "val" / "class_1").iterdir():  # a val class folder without images: the walk's error
        image.unlink()
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(repo=str(ROOT), root=str(root), backend=backend))
    run_two_gloo_ranks(script, [tmp_path / f"rank{r}.json" for r in (0, 1)], timeout=120)
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert rows[0]["walks"] == [str(root / "train"), str(root / "val")] and rows[1]["walks"] == []
    mine = FileList(root / "train", ["class_0", "class_1", "class_2"])
    for row in rows:
        assert row["paths"] == [mine.path(i) for i in range(len(mine))] and row["targets"] == mine.targets.tolist()
        assert row["val"] == f"{root / 'val' / 'class_1'} has no images (" + row["val"].split(" (", 1)[1]
