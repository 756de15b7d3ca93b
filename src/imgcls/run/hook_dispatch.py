"""What Lightning's loop calls around every step for callbacks, hooks and the profiler, at the cost of what runs.

Lightning calls every callback for every hook (`_call_callback_hooks`: six a training step, two a validation step),
each inside `trainer.profiler.profile(...)`, a generator context manager even when nothing profiles. A callback
that inherits a hook unchanged from `Callback` (a no-op) still pays the lookup, its `state_key`, the context and the
call; for a training run's callbacks that is more host work than Lightning's own loop adds over a bare PyTorch loop
(docs/benchmarks.md, "The loop around the network"). Lightning's dispatch does not call a hook attribute that is not
callable (`_call_callback_hooks` in lightning/pytorch/trainer/call.py; tests/test_hook_dispatch.py holds the
installed Lightning to it), so a per-batch hook a callback inherits from `Callback` is set to None on that callback:
what runs is unchanged, the skipped calls did nothing. With no `trainer.profiler`, Lightning's pass-through profiler
is replaced by one (Lightning's extension point, a Profiler subclass) that returns one shared null context.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.utilities.model_helpers import is_overridden

# The hooks Lightning calls once a batch or more often (its epoch hooks run once an epoch: not worth skipping).
PER_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)


class NoProfiler(PassThroughProfiler):
    """trainer.profiler=null: Lightning's pass-through profiler, whose profile() is one reusable null context
    instead of a new generator context for each hook call."""

    _NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.nullcontext[None]:  # type: ignore[override]
        return self._NOTHING


def dispatch_cheaply(trainer: Trainer) -> None:
    """For a constructed Trainer: NoProfiler where no profiler was asked for (a named one stays Lightning's), and
    skip_inherited_batch_hooks for every callback, those given and those Lightning added (a progress bar,
    entry-point callbacks)."""
    made: Any = trainer  # profiler and callbacks: attributes Lightning's connectors set, which Trainer does not declare
    if type(made.profiler) is PassThroughProfiler:
        made.profiler = NoProfiler()
    skip_inherited_batch_hooks(made.callbacks)


def skip_inherited_batch_hooks(callbacks: Iterable[Callback]) -> None:
    """Sets to None each per-batch hook that a callback's class inherits from `Callback` unchanged, so Lightning's
    dispatch passes it over; the hooks a class defines (or a parent other than Callback defines) are left alone."""
    for callback in callbacks:
        for hook in PER_BATCH_HOOKS:
            if not is_overridden(hook, callback, Callback):
                setattr(callback, hook, None)
