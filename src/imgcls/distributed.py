"""What the callbacks of a run need from the process group: a gather of Python objects over ranks, and the
period of the host syncs they share."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

# Optimizer steps between the host syncs of FiniteLoss and of Preemption under DDP. Lightning's logging
# syncs every trainer.log_every_n_steps (50 by default), a multiple of this, so the syncs coincide.
SYNC_EVERY_N_STEPS = 10


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` (a collective under DDP; [obj] in a single process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
