"""BatchRing: a fixed number of batch buffers, handed out in turn, that dali_cpu's torch resize (host_resize.py)
writes its batches into.

Why reuse them: a new 38.5 MB batch (64x3x224x224 floats) was a fresh mmap from glibc that page-faulted in,
0.3 ms an image. The ring replaces the process-wide glibc tuning used before (mallopt: keep every freed block),
which also kept the training step's freed activations: 90 MB more at the first step's peak on the startup
benchmark (docs/data-backends.md "Startup").

The ring does not look at who still holds a batch: the batch handed out `slots` takes after another is written
into the same memory. What makes that safe is the loader's queue, which bounds how far the producer runs ahead
of the consumer; loader.ring_slots gives the size that bound needs, and DaliLoader refuses a smaller ring."""

from __future__ import annotations

import torch


class BatchRing:
    """`slots` buffers, allocated on first use and reused in turn. take() hands out slot k for the k-th batch
    (mod slots), as a view of its first shape[0] rows; a slot whose buffer does not fit (another dtype or
    image size, a larger batch) gets a new one. Called from one thread only (the loader's resize thread)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"a batch ring needs at least 1 slot, not {slots}")
        self.slots = int(slots)
        self.buffers: list[torch.Tensor | None] = [None] * self.slots
        self.taken = 0  # batches handed out so far: the next one is slot `taken % slots`

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        slot = self.taken % self.slots
        self.taken += 1
        buffer = self.buffers[slot]
        if buffer is None or buffer.dtype != dtype or buffer.shape[1:] != shape[1:] or len(buffer) < shape[0]:
            buffer = self.buffers[slot] = torch.empty(shape, dtype=dtype)
        return buffer[: shape[0]]
