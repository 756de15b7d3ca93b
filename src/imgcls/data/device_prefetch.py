"""Batches copied to the GPU one step ahead, on a side stream: the copy of batch N+1 runs while step N computes.

NVIDIA's PyTorch loader does this (image_classification/dataloaders.py `PrefetchedWrapper`), and so does timm's
PrefetchLoader. Lightning copies each batch only when its step starts, on the compute stream, so the step waits
for its own copy. Hand-written here rather than timm's PrefetchLoader, which replaces the DataLoader: imgcls's
loader must stay the object Lightning resumes mid-epoch (samplers.ResumableDataLoader), whose position counts
the batches handed to the trainer, not the one taken ahead.

Both backends use CudaCopies. The torchvision loader stages each batch one ahead in the training thread
(one_batch_ahead: its workers have made it already). The DALI loader (dali/loader.py) stages a batch in the
thread that made it, its producer thread with the torch resize, as soon as it exists: staging one ahead in the
training thread would make the step wait for the next batch's resize. Either way the compute stream waits on
the GPU for the copy, never the host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

Batch = TypeVar("Batch")
Staged = TypeVar("Staged")


def one_batch_ahead(
    batches: Iterator[tuple[Batch, int]], stage: Callable[[Batch], Staged], hand_over: Callable[[Staged], Batch]
) -> Iterator[tuple[Batch, int]]:
    """(batch, loader position after it) pairs, each batch staged (its copy queued) before the previous one is
    handed over; the position travels with its batch, so a checkpoint taken after step N records N."""
    pending: tuple[Staged, int] | None = None
    for batch, position in batches:
        staged = stage(batch)
        if pending is not None:
            yield hand_over(pending[0]), pending[1]
        pending = (staged, position)
    if pending is not None:
        yield hand_over(pending[0]), pending[1]


class CudaCopies:
    """stage(): the batch's tensors copied to `device` on a side stream (non_blocking: async from pinned memory),
    with an event after them; hand_over(): the compute stream waits for that event only (not for later copies),
    and the tensors are recorded as used there, so the caching allocator does not reuse them under the step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def stage(self, batch: Any) -> tuple[Any, Any]:
        with torch.cuda.stream(self.stream):
            copied = tuple(t.to(self.device, non_blocking=True) if torch.is_tensor(t) else t for t in batch)
            done = torch.cuda.Event()
            done.record(self.stream)
        return copied, done

    def hand_over(self, staged: tuple[Any, Any]) -> Any:
        copied, done = staged
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(done)
        for t in copied:
            if torch.is_tensor(t):
                t.record_stream(compute)
        return copied


def copier_for(device: torch.device | None) -> CudaCopies | None:
    """The side-stream copier for a CUDA training device; None elsewhere (a CPU run has nothing to copy)."""
    return CudaCopies(device) if device is not None and device.type == "cuda" else None
