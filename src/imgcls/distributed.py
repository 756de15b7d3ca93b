"""What a run needs from its launch and process group: whether this process is rank 0 and its local rank, as the
launcher announced them; a gather of Python objects over ranks, a result made once and sent to every rank, a
device value agreed over ranks and read on the host a period later (DeferredRead), and the period of the checks the
callbacks share. torch is imported inside the collectives: the config commands read the rank without importing it."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

# Optimizer steps between the checks of FiniteLoss and of Preemption (under DDP): each check starts a DeferredRead
# and reads the one the previous check started. Lightning's logging syncs every trainer.log_every_n_steps (50 by
# default), a multiple of this.
SYNC_EVERY_N_STEPS = 10

T = TypeVar("T")


def is_rank_zero(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process is global rank 0 as the launcher announced it, before any process group exists.

    The variables Lightning's cluster environments read: RANK (torchrun), SLURM_PROCID (srun), and
    NODE_RANK/LOCAL_RANK for Lightning's own launcher (its children have LOCAL_RANK >= 1)."""
    env = os.environ if env is None else env
    for key in ("RANK", "SLURM_PROCID"):
        if env.get(key, "").isdigit():
            return int(env[key]) == 0
    return int(env.get("NODE_RANK") or 0) == 0 and int(env.get("LOCAL_RANK") or 0) == 0


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
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def made_once(make: Callable[[], T]) -> T:
    """`make()` run on global rank 0 only, its result sent to every rank (a collective under DDP; `make()` itself
    in a single process). An exception rank 0 raises is sent too and raised on every rank, so that no rank waits
    for a result that never comes. For work every rank would otherwise repeat on shared storage, such as
    walking a 1.3M-file tree."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return make()
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = (True, make())
        except Exception as exc:  # noqa: BLE001 - raised below on this rank too, after the other ranks have it
            box[0] = (False, exc)
    dist.broadcast_object_list(box, src=0)
    made, value = box[0]
    if not made:
        raise value
    return value


class DeferredRead:
    """The values of a small device tensor, for the host to read later, with no host sync when they are started;
    `over_ranks`: the maximum over ranks (any rank's flag), by an all-reduce started now and not waited for.

    Started at one check and read at the next, a period later, the wait in `values()` is for work that is normally
    long done (and, over ranks, for ranks that started theirs a period ago): it neither drains the device's queue
    nor stops a rank at a collective on the step path. On a GPU the values are copied to pinned host memory behind
    the collective (NCCL's wait() only makes the stream wait) and an event marks the copy; `values()` waits for that
    event, not for the queue. On a CPU (gloo) the collective runs in gloo's threads and `values()` waits for it.
    Every rank must start its DeferredReads in the same order (a collective each)."""

    def __init__(self, tensor: torch.Tensor, over_ranks: bool) -> None:
        import torch
        import torch.distributed as dist

        self._work: Any = None
        if over_ranks and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, async_op=True)
        self._event: Any = None
        self._host = tensor
        if tensor.device.type == "cuda":
            if self._work is not None:
                self._work.wait()  # NCCL: the current stream waits for the collective; the host does not
                self._work = None
            self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._host.copy_(tensor, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()

    def values(self) -> list[Any]:
        """The values, as Python numbers (flattened); waits for the collective and the copy if they are not done."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        values: list[Any] = self._host.reshape(-1).tolist()
        return values
