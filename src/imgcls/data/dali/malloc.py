"""glibc malloc tuning for a process that allocates a batch-sized buffer at every step."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h


@functools.cache  # once per process
def keep_freed_memory() -> None:
    """Stop glibc from unmapping freed blocks over 32 MiB.

    A batch of 64x3x224x224 floats is 38.5 MB, over glibc's largest adaptive mmap threshold, so every
    batch is a fresh mmap and page-faults in its memory again, a third of the pipeline's time on the CPU
    (docs/data-backends.md). The same tuning as MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_, or what PyTorch's CPU
    tuning guide gets from jemalloc/tcmalloc. A no-op off glibc."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, 1 << 30)
        mallopt(_M_TRIM_THRESHOLD, 1 << 30)
