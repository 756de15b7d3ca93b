"""storage.write_atomic in a folder where someone planted links: a link at a temp name never redirects the write
or the chmod, temp names cannot be guessed in advance, and a durable save cleans up only its own leftovers."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from imgcls.errors import StorageError
from imgcls.run.train import run
from imgcls.storage import readable_mode, temp_prefix, write_atomic
from imgcls.training.checkpoint import AtomicCheckpointIO
from tests.conftest import compose_config, make_image_folder, tiny_overrides

VICTIM_TEXT = "the user's notes: not a checkpoint\n"


def victim(folder: Path) -> Path:
    """A file of the user's outside the folder being written, with a mode imgcls would never give its files."""
    path = folder / "victim.txt"
    path.write_text(VICTIM_TEXT)
    path.chmod(0o600)
    return path


def untouched(path: Path) -> bool:
    return path.read_text() == VICTIM_TEXT and path.stat().st_mode & 0o777 == 0o600


def temp_names(path: Path, durable: bool, saves: int = 2) -> list[str]:
    """The temp names `saves` writes of PATH used, as the write callable saw them."""
    seen: list[str] = []

    def write(tmp: Path) -> None:
        seen.append(tmp.name)
        tmp.write_bytes(b"new")

    for _ in range(saves):
        write_atomic(path, write, what="checkpoint", durable=durable)
    return seen


def test_a_link_at_the_old_fixed_temp_name_is_never_written_through(tmp_path: Path) -> None:
    """`last.ckpt.tmp -> victim.txt` made a fresh run's first save write the checkpoint into victim.txt and
    chmod it 0644."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    target = victim(tmp_path)
    (folder / "last.ckpt.tmp").symlink_to(target)
    AtomicCheckpointIO().save_checkpoint({"w": torch.ones(1000)}, folder / "last.ckpt")
    assert untouched(target)
    assert os.readlink(folder / "last.ckpt.tmp") == str(target)  # the link itself is not ours to remove
    assert torch.equal(torch.load(folder / "last.ckpt")["w"], torch.ones(1000))
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "last.ckpt.tmp"]


@pytest.mark.parametrize("durable", [True, False])
def test_temp_names_are_new_and_random(tmp_path: Path, durable: bool) -> None:
    names = temp_names(tmp_path / "last.ckpt", durable)
    assert len(set(names)) == 2, names  # a name known before the save could be planted
    for name in names:
        assert re.fullmatch(re.escape(temp_prefix(tmp_path / "last.ckpt")) + r"[a-z0-9_]{8}\.tmp", name), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_links_at_temp_like_names_are_left_alone(tmp_path: Path) -> None:
    """A durable save removes its own kind of leftovers: a link with such a name is neither followed nor removed."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    target = victim(tmp_path)
    links = [folder / f"{temp_prefix(folder / 'last.ckpt')}{tag}.tmp" for tag in ("abcdefgh", "00000000")]
    for link in links:
        link.symlink_to(target)
    for _ in range(3):
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(10)}, folder / "last.ckpt")
    assert untouched(target) and all(os.readlink(link) == str(target) for link in links)


def test_a_durable_save_removes_only_its_own_leftovers(tmp_path: Path) -> None:
    """What a save killed mid-write leaves (a temp file of ours) goes at the next save: one orphan at most, not
    one more per kill. Files that only resemble one stay."""
    path = tmp_path / "last.ckpt"
    prefix = temp_prefix(path)
    orphans = [tmp_path / f"{prefix}{tag}.tmp" for tag in ("k1ll3d_0", "zzzzzzzz")]
    for orphan in orphans:
        orphan.write_bytes(b"half a checkpoint")
    others = [tmp_path / name for name in ("last.ckpt.tmp", f"{prefix}short.tmp", ".best.ckpt.imgcls.abcdefgh.tmp",
                                           f"{prefix}abcdefgh.tmp.keep", f"{prefix}ABCDEFGH.tmp")]  # fmt: skip
    for other in others:
        other.write_text("not a leftover of last.ckpt's\n")
    write_atomic(path, lambda tmp: tmp.write_bytes(b"whole"), what="checkpoint", durable=True)
    assert not any(o.exists() for o in orphans)
    assert all(o.read_text() == "not a leftover of last.ckpt's\n" for o in others)
    assert path.read_bytes() == b"whole"
    write_atomic(path, lambda tmp: tmp.write_bytes(b"plain"))  # only durable saves clean up
    assert len(list(tmp_path.iterdir())) == 1 + len(others)


@pytest.mark.parametrize("durable", [True, False])
def test_a_temp_swapped_for_a_link_while_written_is_not_published(tmp_path: Path, durable: bool) -> None:
    """The mode is set on mkstemp's descriptor, and the name must still be that file at the rename: a temp
    replaced by a link between its creation and the rename neither chmods the link's target nor becomes the
    checkpoint."""
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"previous")
    target = victim(tmp_path)

    def swapped(tmp: Path) -> None:
        tmp.unlink()
        tmp.symlink_to(target)

    with pytest.raises(StorageError, match="was replaced while being written.*previous checkpoint is intact"):
        write_atomic(path, swapped, what="checkpoint", durable=durable)
    assert untouched(target) and path.read_bytes() == b"previous"


def test_a_destination_that_is_a_link_is_replaced_not_written_through(tmp_path: Path) -> None:
    """os.replace renames over the link itself: the file it pointed to keeps its bytes and mode."""
    target = victim(tmp_path)
    link = tmp_path / "eval.json"
    link.symlink_to(target)
    write_atomic(link, lambda tmp: tmp.write_text("{}\n"))
    assert untouched(target)
    assert not link.is_symlink() and link.read_text() == "{}\n"
    assert link.stat().st_mode & 0o777 == readable_mode()


@pytest.mark.slow
def test_a_training_run_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    data = make_image_folder(tmp_path / "data", classes=3, train_per_class=4, val_per_class=2)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    target = victim(tmp_path)
    for name in ("last.ckpt.tmp", "best.ckpt.tmp"):
        (run_dir / "checkpoints" / name).symlink_to(target)
    run(compose_config(tiny_overrides(data, "recipe.epochs=1"), run_dir=run_dir))
    assert untouched(target)
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] > 0
