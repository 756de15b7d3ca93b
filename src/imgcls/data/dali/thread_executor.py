"""OneThreadExecutor: one daemon thread that runs the calls submitted to it, in order, on the caller's CUDA
device. DaliLoader (loader.py) makes every call into its DALI iterator here, so the iterator never changes
threads while the consumer trains.

Not concurrent.futures.ThreadPoolExecutor(1): its thread is joined at interpreter exit (a loader that is never
closed, its producer blocked on a full queue, would keep the process from exiting), and it keeps no CUDA
device. This thread is a daemon and holds no reference to a task's owner between tasks, so a dropped loader
is collected and its finalizer (close) ends the thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch


class OneThreadExecutor:
    """The calls submitted to it run one at a time, in submission order, in one daemon thread named NAME."""

    def __init__(self, name: str) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.device = torch.cuda.current_device() if torch.cuda.is_available() else None
        self.thread = threading.Thread(
            target=OneThreadExecutor._run, args=(self._tasks, self.device), name=name, daemon=True
        )
        self.thread.start()

    @staticmethod
    def _run(tasks: queue.SimpleQueue, device: int | None) -> None:
        if device is not None:  # pinned batches and the caching host allocator follow the caller's device
            torch.cuda.set_device(device)
        while (task := tasks.get()) is not None:
            call, future = task
            del task  # no reference to the task's owner while waiting for the next task
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
                    future.set_exception(exc)
            del call, future

    def submit(self, call: Callable[[], Any]) -> Future:
        future: Future = Future()
        self._tasks.put((call, future))
        return future

    def call(self, call: Callable[[], Any]) -> Any:
        """CALL's result (or its exception), after every call submitted before it."""
        return self.submit(call).result()

    def close(self) -> None:
        """The thread ends after the calls already submitted."""
        self._tasks.put(None)
