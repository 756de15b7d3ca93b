"""What a run needs from its launch and process group: the local rank the launcher announced, a gather of
Python objects over ranks, and the period of the host syncs the callbacks share."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

# Optimizer steps between the host syncs of FiniteLoss and of Preemption under DDP. Lightning's logging
# syncs every trainer.log_every_n_steps (50 by default), a multiple of this, so the syncs coincide.
SYNC_EVERY_N_STEPS = 10


def launcher_local_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank on its node as the launcher announced it, before Lightning has set a device:
    LOCAL_RANK (Lightning's launcher, torchrun), else SLURM_LOCALID (srun sets no LOCAL_RANK), else 0."""
    env = os.environ if env is None else env
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return 0


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` (a collective under DDP; [obj] in a single process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
