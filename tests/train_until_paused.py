"""`python tests/train_until_paused.py MARKER after:N|write:N OVERRIDE...`: train.py that stops still at a chosen
checkpoint, so a test can SIGKILL it there on any machine's speed (tests/test_kill_resume.py).

after:N  - right after this process's N-th last.ckpt is in place (renamed and fsynced);
write:N  - inside its N-th last.ckpt write: the temp file written, not yet renamed into place.
Then MARKER is created and the process sleeps until it is killed. A script, not a fixture: the kill must hit a
real training process (its own pid, its open files), as a cluster's would."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import imgcls.training.checkpoint  # noqa: E402
from imgcls.cli import train_main  # noqa: E402

marker, (when, count) = Path(sys.argv[1]), sys.argv[2].split(":")
sys.argv = [str(Path(__file__).resolve().parents[1] / "train.py"), *sys.argv[3:]]
real_write_atomic = imgcls.training.checkpoint.write_atomic
writes = 0


def stand_still() -> None:
    marker.write_text(f"{when}:{count}")
    while True:
        time.sleep(60)


def write_atomic(path: Path, write: Any, what: str = "", durable: bool = False) -> None:
    global writes
    if Path(path).name != "last.ckpt":
        return real_write_atomic(path, write, what, durable)
    writes += 1
    if when == "write" and writes == int(count):

        def write_then_stand_still(tmp: Path) -> None:
            write(tmp)
            stand_still()

        return real_write_atomic(path, write_then_stand_still, what, durable)
    real_write_atomic(path, write, what, durable)
    if when == "after" and writes == int(count):
        stand_still()


imgcls.training.checkpoint.write_atomic = write_atomic
train_main()
