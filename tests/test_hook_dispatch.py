"""Lightning's per-step dispatch under imgcls: a per-batch hook a callback inherits from Callback is not called
(it did nothing), the hooks a callback defines are, as often as before, and imgcls's loop makes no more Python
calls a step than Lightning's smallest module does (bench.overhead's count: the machine's speed does not move it)."""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from imgcls.bench import overhead
from imgcls.run.hook_dispatch import PER_BATCH_HOOKS, NoProfiler, dispatch_cheaply, skip_inherited_batch_hooks
from tests.tiny_fit import tiny_fit, tiny_trainer


class BatchEnds(Callback):
    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self.seen["on_train_batch_end"] += 1


class BatchEndsToo(BatchEnds):
    def on_before_backward(self, *args: Any) -> None:
        self.seen["on_before_backward"] += 1


def test_only_hooks_inherited_from_callback_are_skipped() -> None:
    callbacks = [BatchEnds(), BatchEndsToo(), ModelCheckpoint()]
    skip_inherited_batch_hooks(callbacks)
    ends, too, checkpoint = callbacks
    assert ends.on_before_backward is None and ends.on_validation_batch_end is None
    assert callable(ends.on_train_batch_end)
    assert callable(too.on_before_backward) and callable(too.on_train_batch_end)  # its own and its parent's
    assert callable(checkpoint.on_train_batch_end) and checkpoint.on_before_zero_grad is None  # Lightning's class
    skipped = {hook for hook in PER_BATCH_HOOKS if getattr(ends, hook) is None}
    assert skipped == set(PER_BATCH_HOOKS) - {"on_train_batch_end"}


def test_a_real_trainer_calls_the_defined_hooks_as_often_and_the_null_profiler_profiles_nothing(tmp_path: Path) -> None:
    seen = []
    for cheaply in (False, True):
        callback = BatchEndsToo()
        trainer = tiny_trainer(tmp_path, [callback])
        if cheaply:
            dispatch_cheaply(trainer)
            assert type(trainer.profiler) is NoProfiler and callback.on_after_backward is None
        tiny_fit(trainer)
        seen.append(callback.seen)
    assert seen[0] == seen[1] == Counter(on_train_batch_end=6, on_before_backward=6)
    assert isinstance(NoProfiler().profile("x"), contextlib.nullcontext)


def test_imgcls_makes_no_more_python_calls_a_step_than_lightnings_smallest_module(tmp_path: Path) -> None:
    """The plain set (test_resnet, fp32, SGD, data=synthetic) over the same 100 steps (imgcls's include the two
    steps that log train.loss and train.lr: Lightning's smallest module logs nothing). Before the dispatch above,
    imgcls's 11 callbacks cost ~16 calls per inherited no-op hook: ~4000 calls a step against Lightning's ~2950."""
    cfg = overhead.compose([], steps=100, warmup=10, run_dir=str(tmp_path), feature_set="plain")
    imgcls_calls = overhead.imgcls_loop(cfg, count_calls=True)["calls"]
    lightning_calls = overhead.lightning_loop(cfg, 100, 10, count_calls=True)["calls"]
    bare_calls = overhead.bare_loop(cfg, 100, 10, count_calls=True)["calls"]
    assert bare_calls < imgcls_calls <= lightning_calls, (bare_calls, imgcls_calls, lightning_calls)
