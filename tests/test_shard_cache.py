"""data.shard_cache (data/shards/cache.py): the three writers put their files where the one layout says;
`python -m imgcls.data.shards cache list` counts them per kind; `cache prune` removes imgcls's files least
recently used first, and nothing else (foreign files, symbolic links, a download under way); every mistake is
one line. The cache is filled by the real writers: remote copies of pipe: URLs (remote.local_copy), DALI index
files (tfrecord.dali_index_files), record counts (open_shard_set on shards without a manifest). The command
runs in-process through the same dispatcher as `python -m imgcls.data.shards` (test_shard_convert.py starts
that module as a process)."""

from __future__ import annotations

import fcntl
import os
import re
import time
from pathlib import Path

import pytest

from imgcls.config.compose import group_option
from imgcls.config.schema import DataSchema
from imgcls.data.shards import cache, manifest, remote, tfrecord, webdataset
from imgcls.data.shards.__main__ import main as shards_main
from imgcls.data.shards.manifest import ShardSet
from imgcls.errors import ConfigError
from imgcls.typed_config import settings

DAY = 86400.0


def open_shard_set(cfg: dict) -> ShardSet:
    """The test's data keys over the data schema's defaults, as a composed data config has them."""
    return manifest.open_shard_set(settings(DataSchema, cfg))


def make_sources(folder: Path) -> dict[str, Path]:
    """Shard files to cache: two 'remote' tars (fetched by pipe:cat), a TFRecord file without an index, and a
    webdataset train/val pair without a manifest (their counts are scanned and cached)."""
    folder.mkdir()
    paths = {}
    for name, size in (("a.tar", 3000), ("b.tar", 5000)):
        paths[name] = folder / name
        paths[name].write_bytes(os.urandom(size))
    paths["records"] = folder / "train-00000-of-00001"
    with open(paths["records"], "wb") as out:
        for label in (1, 2, 1):
            tfrecord.write_record(out, tfrecord.encode_example(os.urandom(100), label))
    wds = folder / "wds"
    wds.mkdir()
    for name, count in (("train-00000-of-00001.tar", 3), ("validation-00000-of-00001.tar", 2)):
        with open(wds / name, "wb") as out:
            writer = webdataset.ShardWriter(out)
            for i in range(count):
                writer.write(f"s{i}", os.urandom(50), i % 2)
            writer.close()
    paths["wds"] = wds
    return paths


def filled(tmp_path: Path) -> tuple[Path, dict[str, Path], dict[str, Path]]:
    """TMP/cache as runs leave it, the sources it holds copies of, and each writer's file by name."""
    root = tmp_path / "cache"
    sources = make_sources(tmp_path / "src")
    return root, sources, fill(root, sources)


def fill(root: Path, sources: dict[str, Path]) -> dict[str, Path]:
    """The cache as runs leave it: each writer's file, by name."""
    copies = {n: Path(remote.local_copy(f"pipe:cat {sources[n]}", str(root))) for n in ("a.tar", "b.tar")}
    (index,) = tfrecord.dali_index_files([str(sources["records"])], None, str(root))
    shard_set = open_shard_set(
        {"root": str(sources["wds"]), "format": "webdataset", "num_classes": 2, "shard_cache": str(root)}
    )
    assert shard_set.count("train") == 3 and shard_set.count("val") == 2
    counts = {p.name.split("-", 1)[1].split("-")[0]: p for p in (root / "counts").iterdir()}
    return {**copies, "index": Path(index), "count_train": counts["train"], "count_val": counts["validation"]}


def add_foreign(root: Path, outside: Path) -> list[Path]:
    """Files that are not imgcls's: beside the layout, off it inside remote/, and a link out of the cache."""
    outside.write_bytes(b"keep me: outside the cache")
    (root / "remote" / "s3" / "bucket").mkdir(parents=True)
    link = root / "remote" / "s3" / "bucket" / "link.tar"
    link.symlink_to(outside)
    foreign = [root / "notes.txt", root / "remote" / "README", root / "mine" / "data.bin", link]
    (root / "mine").mkdir()
    for path in foreign[:3]:
        path.write_bytes(b"x" * 7000)  # larger than any entry: a prune that counted it would take more
    return foreign


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = shards_main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def list_lines(root: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, tuple[int, str]]:
    code, out, err = run(["cache", "list", "--dir", str(root)], capsys)
    assert code == 0 and err == "", err
    rows = {}
    for line in out.splitlines()[1:]:
        match = re.match(r"\s+(remote|dali_idx|counts|in flight|total)\s+(\d+) files\s+(.*)$", line)
        if match:
            rows[match.group(1)] = (int(match.group(2)), match.group(3))
    return rows


def set_last_use(path: Path, days_ago: float, now: float) -> None:
    os.utime(path, (now - days_ago * DAY, now - days_ago * DAY))


def test_the_writers_use_the_layout_and_list_counts_each_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, sources, made = filled(tmp_path)
    foreign = add_foreign(root, tmp_path / "outside.tar")

    relative = {k: p.relative_to(root).parts for k, p in made.items()}
    for name in ("a.tar", "b.tar"):
        assert relative[name][:2] == ("remote", "pipe") and relative[name][3] == name
        assert made[name].read_bytes() == sources[name].read_bytes()
    assert relative["index"][0] == "dali_idx" and re.fullmatch(r"[0-9a-f]{16}", relative["index"][1])
    assert relative["index"][2] == "train-00000-of-00001.idx"
    assert re.fullmatch(r"[0-9a-f]{16}-validation-00000-of-00001\.tar\.json", relative["count_val"][1])
    assert (root / cache.TAG).read_text().startswith(cache.TAG_SIGNATURE + "\n")

    rows = list_lines(root, capsys)
    sizes = {k: p.stat().st_size for k, p in made.items()}
    assert rows["remote"][0] == 2 and rows["dali_idx"][0] == 1 and rows["counts"][0] == 2
    assert rows["in flight"][0] == 2  # the two copies' .NAME.lock files (empty)
    total = sum(sizes.values())
    assert rows["total"] == (7, f"{cache.format_size(total)} ({total} bytes)")
    code, out, _ = run(["cache", "--dir", str(root)], capsys)  # `cache` alone lists
    assert code == 0 and f"not imgcls's: {len(foreign)} (never pruned)" in out
    assert out.splitlines()[0] == f"data.shard_cache={root}"


def test_prune_removes_the_least_recently_used_first_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, sources, made = filled(tmp_path)
    outside = tmp_path / "outside.tar"
    foreign = add_foreign(root, outside)
    now = time.time()
    # Last used: a.tar 50 days ago, the index 40, the counts 30 and 20, b.tar 10.
    for name, days in (("a.tar", 50), ("index", 40), ("count_train", 30), ("count_val", 20), ("b.tar", 10)):
        set_last_use(made[name], days, now)
    # A run reuses a.tar: local_copy marks it used now (its mtime stays, its atime moves).
    mtime = made["a.tar"].stat().st_mtime_ns
    assert remote.local_copy(f"pipe:cat {sources['a.tar']}", str(root)) == str(made["a.tar"])
    assert made["a.tar"].stat().st_mtime_ns == mtime and made["a.tar"].stat().st_atime > now - 60

    # Room for a.tar and b.tar only: the index and both counts go, oldest first; a.tar stays (just used).
    limit = made["a.tar"].stat().st_size + made["b.tar"].stat().st_size
    removed = sum(made[k].stat().st_size for k in ("index", "count_train", "count_val"))
    code, out, err = run(["cache", "prune", "--max-size", f"{limit}B", "--dir", str(root)], capsys)
    assert code == 0 and err == ""
    assert out.startswith(f"removed 3 files ({cache.format_size(removed)}) from {root}; kept "), out
    assert sorted(k for k, p in made.items() if p.exists()) == ["a.tar", "b.tar"]
    for path in foreign:
        assert os.path.lexists(path), path
    assert outside.read_bytes() == b"keep me: outside the cache" and (root / cache.TAG).exists()

    # One byte under the two copies: the least recently used of them goes (b.tar, 10 days; a.tar was reused).
    code, out, _ = run(["cache", "prune", "--max-size", f"{limit - 1}", "--dir", str(root)], capsys)
    assert code == 0 and out.startswith("removed 1 files")
    assert made["a.tar"].exists() and not made["b.tar"].exists()
    assert not (made["b.tar"].parent / ".b.tar.lock").exists()  # a copy's lock goes with it
    # Pruned files are fetched again when asked for.
    assert (
        Path(remote.local_copy(f"pipe:cat {sources['b.tar']}", str(root))).read_bytes() == sources["b.tar"].read_bytes()
    )
    for path in foreign:
        assert os.path.lexists(path), path


def test_prune_older_than_days(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, _, made = filled(tmp_path)
    now = time.time()
    for name, days in (("a.tar", 45), ("b.tar", 5), ("index", 31), ("count_train", 29.5), ("count_val", 1)):
        set_last_use(made[name], days, now)
    code, out, _ = run(["cache", "prune", "--older-than", "30", "--dir", str(root)], capsys)
    assert code == 0 and out.startswith("removed 2 files")
    assert sorted(k for k, p in made.items() if p.exists()) == ["b.tar", "count_train", "count_val"]
    # Both limits: older than 30 days OR past the size, whichever removes more.
    code, out, _ = run(["cache", "prune", "--older-than", "2", "--max-size", "1TB", "--dir", str(root)], capsys)
    assert code == 0 and sorted(k for k, p in made.items() if p.exists()) == ["count_val"]


def test_files_being_written_are_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A download under way (its lock held, or its .part recent) and a recent .tmp are never deleted; what a
    killed process left (old, unlocked, in the index) is; a copy locked for a new download is kept and
    reported. A file with a temp's name that the index does not name is not imgcls's: kept, however old."""
    root, _, made = filled(tmp_path)
    folder = made["a.tar"].parent
    old = time.time() - 2 * cache.TEMP_GRACE_S
    young_part = folder / ".x.tar.abcd1234.part"
    dead_part = folder / ".y.tar.k2j4h5g6.part"
    locked_part = folder / ".z.tar.q1w2e3r4.part"
    dead_tmp = root / "counts" / ".0123456789abcdef-w.tar.json.a1b2c3d4.tmp"
    young_tmp = made["index"].parent / ".train-00000-of-00001.idx.zz99yy88.tmp"
    users = folder / ".notes.txt.abcdefgh.part"  # named like a temp, but imgcls never made it
    for path in (young_part, dead_part, locked_part, dead_tmp, young_tmp):
        cache.record(str(root), path)  # as download_temp and write_file enter their temps
    for path in (young_part, dead_part, locked_part, dead_tmp, young_tmp, users):
        path.write_bytes(b"p" * 100)
    for path in (dead_part, locked_part, dead_tmp, users):
        os.utime(path, (old, old))
    holders = []
    for target in (folder / "z.tar", made["b.tar"]):  # what remote._lock holds while it downloads
        fd = cache.open_lock(str(root), str(target))
        fcntl.flock(fd, fcntl.LOCK_EX)
        holders.append(fd)
    try:
        code, out, err = run(["cache", "prune", "--max-size", "0", "--dir", str(root)], capsys)
    finally:
        for fd in holders:
            os.close(fd)
    assert code == 0 and err == "" and out.rstrip().endswith(", 1 of them in use by a download"), out
    assert not dead_part.exists() and not dead_tmp.exists()
    assert young_part.exists() and locked_part.exists() and young_tmp.exists() and users.exists()
    assert made["b.tar"].exists() and not made["a.tar"].exists()
    assert not made["index"].exists() and not made["count_val"].exists()
    rows = list_lines(root, capsys)
    assert rows["remote"][0] == 1 and rows["in flight"][0] == 5  # 3 temp files, b.tar's and z.tar's locks


def test_a_users_folder_with_other_files_is_never_tagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """data.shard_cache pointed at a folder of the user's: imgcls writes its cache files there, but no
    CACHEDIR.TAG (backup tools would skip the user's files), so prune refuses the folder and deletes nothing."""
    root = tmp_path / "users-data"
    root.mkdir()
    (root / "thesis.txt").write_text("the user's")
    sources = make_sources(tmp_path / "src")
    copy = Path(remote.local_copy(f"pipe:cat {sources['a.tar']}", str(root)))
    assert copy.is_file() and not (root / cache.TAG).exists()
    code, out, err = run(["cache", "prune", "--max-size", "0", "--dir", str(root)], capsys)
    assert code == 2 and err.startswith(f"imgcls: error: --dir={root} has no {cache.TAG} of imgcls")
    assert copy.is_file() and (root / "thesis.txt").read_text() == "the user's"


def test_prune_needs_imgcls_tag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder laid out like a cache but not tagged by imgcls (--dir pointed at the wrong place), or tagged
    by another tool, is refused whole: nothing is deleted."""
    root = tmp_path / "looks-like-a-cache"
    files = [root / "remote" / "s3" / "b" / "x.tar", root / "counts" / "0123456789abcdef-x.tar.json"]
    for path in files:
        path.parent.mkdir(parents=True)
        path.write_bytes(b"data")
        cache.record(str(root), path)  # even files the index names
    for tag in (None, f"{cache.TAG_SIGNATURE}\n# This file is a cache directory tag created by another tool.\n"):
        if tag is not None:
            (root / cache.TAG).write_text(tag)
        code, out, err = run(["cache", "prune", "--max-size", "0", "--dir", str(root)], capsys)
        assert code == 2 and out == "" and err.count("\n") == 1
        assert err.startswith(f"imgcls: error: --dir={root} has no {cache.TAG} of imgcls")
        assert all(p.exists() for p in files)
    assert list_lines(root, capsys)["total"][0] == 2  # listing needs no tag


def test_mistakes_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _, _ = filled(tmp_path)
    before = sorted(str(p) for p in root.rglob("*"))
    missing = tmp_path / "nope"
    monkeypatch.setenv("IMGCLS_CACHE", str(tmp_path / "nowhere"))
    cases = [
        (
            ["cache", "prune", "--max-size", "20XB", "--dir", str(root)],
            "--max-size=20XB is not a size; allowed: a number and a unit B, KB, MB, GB, TB",
        ),
        (["cache", "prune", "--max-size=-1GB", "--dir", str(root)], "--max-size=-1GB is not a size"),
        (
            ["cache", "prune", "--older-than", "soon", "--dir", str(root)],
            "--older-than=soon is not allowed; a number of days >= 0",
        ),
        (["cache", "prune", "--older-than", "-3", "--dir", str(root)], "--older-than=-3 is not allowed"),
        (["cache", "list", "--dir", str(missing)], f"--dir={missing} does not exist; allowed: a folder"),
        (["cache", "prune", "--max-size", "1GB", "--dir", str(root / cache.TAG)], "is not a folder"),
        (["cache"], f"data.shard_cache={tmp_path}/nowhere/shards (the default) does not exist"),
        (["cache", "prune", "--dir", str(root)], "cache prune needs --max-size SIZE and/or --older-than DAYS"),
        (["cache", "purge"], "cache purge is not a cache command; allowed: list, prune"),
        (["cache", "--size", "1GB"], "unknown argument --size; allowed: --dir, --max-size, --older-than"),
        (["cache", "list", "--max-size", "1GB"], "are options of `cache prune`, not of `cache list`"),
        (["cache", "prune", "--max-size"], "--max-size needs a value"),
        ([], "COMMAND is not set; allowed: convert, cache"),
        (["shard", "a", "b"], "COMMAND=shard is not allowed; allowed: convert, cache"),
    ]
    for argv, expected in cases:
        code, out, err = run(argv, capsys)
        assert code == 2 and out == "", argv
        assert err.count("\n") == 1 and err.startswith("imgcls: error: ") and expected in err, err
    assert sorted(str(p) for p in root.rglob("*")) == before


def test_sizes_and_the_default_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cache.parse_size("20GB") == 20 * 10**9
    assert cache.parse_size("1.5GiB") == 3 * 2**29
    assert cache.parse_size("512 MiB") == 512 * 2**20
    assert cache.parse_size("0") == 0 and cache.parse_size("7b") == 7 and cache.parse_size("2tb") == 2 * 10**12
    for bad in ("", "GB", "20G", "1e9", "20 GB B"):
        with pytest.raises(ConfigError, match=r"is not a size; allowed"):
            cache.parse_size(bad)
    # The command's default folder is data.shard_cache's default (data/_base: the schema's), with and without
    # IMGCLS_CACHE.
    configured = group_option("data", "_base")
    monkeypatch.setenv("IMGCLS_CACHE", str(tmp_path / "c"))
    assert cache.default_dir() == configured.shard_cache == f"{tmp_path}/c/shards"
    monkeypatch.delenv("IMGCLS_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.default_dir() == configured.shard_cache == f"{tmp_path}/home/.cache/imgcls/shards"
