"""`python tests/train_until_signalled.py MARKER N OVERRIDE...`: train.py that waits, right after its N-th last.ckpt is
in place, until a preemption signal has reached imgcls's handler, then trains on; so a test's SIGTERM (SIGUSR1,
SIGUSR2) is acted on at the same optimizer step on any machine's speed: the next one after that checkpoint's.

MARKER is created when the process waits: send the signal then. The wait is bounded (WAIT_S), as a test that never
sends one would otherwise hang; the process then trains on and the test's own checks fail. The signal is handled
by imgcls's own handler (a flag in imgcls.callbacks.preemption), which Python runs in this main thread between
two of the wait's sleeps. A script, not a fixture: the signal must hit a real training process (its own pid), as a
cluster's would. The same pattern as tests/train_until_paused.py, which stops still for a SIGKILL instead.

Where a launcher starts train.py itself (submitit's controller starts the task), `WaitAfterCheckpoint` does the same
as a Hydra callback: `+hydra.callbacks.waiter._target_=tests.train_until_signalled.WaitAfterCheckpoint
+hydra.callbacks.waiter.marker=MARKER` (with the repository on PYTHONPATH); a requeued task, which finds MARKER,
trains through."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hydra.experimental.callback import Callback  # noqa: E402

import imgcls.training.checkpoint  # noqa: E402
from imgcls.callbacks.preemption import received_signal  # noqa: E402
from imgcls.cli import train_main  # noqa: E402

WAIT_S = 300  # bounds a hang only: the test sends its signal as soon as MARKER exists


def wait_after_checkpoint(marker: Path, count: int) -> None:
    """From now on, this process waits right after its COUNT-th last.ckpt until a signal has been handled."""
    real_write_atomic = imgcls.training.checkpoint.write_atomic
    writes = 0

    def write_atomic(path: Path, write: Any, what: str = "", durable: bool = False) -> None:
        nonlocal writes
        real_write_atomic(path, write, what, durable)
        if Path(path).name != "last.ckpt":
            return
        writes += 1
        if writes == count:
            marker.write_text(f"after:{count}")
            deadline = time.monotonic() + WAIT_S
            while received_signal() is None and time.monotonic() < deadline:
                time.sleep(0.01)

    imgcls.training.checkpoint.write_atomic = write_atomic


class WaitAfterCheckpoint(Callback):
    """wait_after_checkpoint(MARKER, COUNT) in a job Hydra runs, unless MARKER exists (the job run again)."""

    def __init__(self, marker: str, count: int = 1) -> None:
        self.marker, self.count = Path(marker), int(count)

    def on_job_start(self, config: Any, **kwargs: Any) -> None:
        if not self.marker.exists():
            wait_after_checkpoint(self.marker, self.count)


if __name__ == "__main__":
    marker, count = Path(sys.argv[1]), int(sys.argv[2])
    sys.argv = [str(Path(__file__).resolve().parents[1] / "train.py"), *sys.argv[3:]]
    wait_after_checkpoint(marker, count)
    train_main()
