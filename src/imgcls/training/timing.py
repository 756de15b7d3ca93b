"""Data-wait and compute time per batch, and images per second, as NVIDIA's DLLogger reports them
(train.data_time, train.compute_time, train.total_ips, train.compute_ips); report.json and the training
benchmark both time with it."""

from __future__ import annotations

import time
from typing import Any

import torch


class StepTimer:
    """Per-phase data-wait and compute time of every batch, without a host sync per batch.

    data_time is host time spent waiting for the loader (from one batch's end hook to the next one's start
    hook). compute_time on CUDA is device time, from an event recorded when the batch starts to one recorded
    when it ends; the events are only read in summary() (once an epoch), so the CPU keeps queueing kernels
    instead of waiting for each step (NVIDIA called torch.cuda.synchronize() every step). Elsewhere it is
    host time. total_ips divides by wall time, which ends when the device finished the last batch."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.samples = 0
        self.data_time = 0.0
        self.compute_time = 0.0
        self.batches = 0
        self.started = time.perf_counter()
        self.last_end = self.started
        self.batch_start = self.started
        self._events: list[tuple[Any, Any]] = []  # (start, end) CUDA events, read in summary()
        self._start_event: Any = None
        self._first: tuple[float, Any] | None = None  # (host time, CUDA event) of the first batch's start

    def batch_started(self, device: torch.device | None = None) -> None:
        now = time.perf_counter()
        self.data_time += now - self.last_end
        self.batch_start = now
        if device is not None and device.type == "cuda":
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record()
            if self._first is None:
                self._first = (now, self._start_event)

    def batch_ended(self, samples: int, device: torch.device) -> None:
        now = time.perf_counter()
        if device.type == "cuda" and self._start_event is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((self._start_event, end))
            self._start_event = None
        else:
            self.compute_time += now - self.batch_start
        self.last_end = now
        self.samples += samples
        self.batches += 1

    def _read_events(self) -> None:
        if self._events:
            last_end = self._events[-1][1]
            last_end.synchronize()  # the one sync: the device has finished every timed batch
            # The device finished the last batch at the first batch's start (host time, when the device was idle at
            # an epoch's start) plus the device time between them: not when summary() runs, which for the train
            # timer is after validation (that counted validation as training time).
            assert self._first is not None
            first_host, first_event = self._first
            self.last_end = max(self.last_end, first_host + first_event.elapsed_time(last_end) / 1000.0)
            self.compute_time += sum(start.elapsed_time(end) for start, end in self._events) / 1000.0
            self._events = []

    def summary(self, prefix: str, world_size: int) -> dict[str, float]:
        self._read_events()
        wall = max(self.last_end - self.started, 1e-9)
        out = {
            f"{prefix}.total_ips": world_size * self.samples / wall,
            f"{prefix}.compute_ips": world_size * self.samples / max(self.compute_time, 1e-9),
        }
        if prefix == "train":
            out["train.data_time"] = self.data_time / max(self.batches, 1)
            out["train.compute_time"] = self.compute_time / max(self.batches, 1)
        return out
