"""`python -m imgcls.bench.stages SOURCE --backend dali_cpu [startup options]`: where a start's memory goes.

Runs one start of the startup benchmark (imgcls.bench.startup: the same tree, the same train.py overrides)
inside this process, with hooks at its milestones, and prints at each one the process's resident memory
(VmRSS), its peak so far (VmHWM, exact), the peak seen since the previous milestone by a 20 ms sampler
(RSS plus the DataLoader workers' private memory, as the startup benchmark counts a rank) and glibc's heap
(in use / free / mmapped, mallinfo2). DALI is imported only for a DALI backend, as train.py does.
Milestones: imports done, the split's file list built, the train loader built (a DALI loader has run its
first batch by then), the first batch in the training step, its forward, its backward, the step's end.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

from imgcls.bench import startup


def _status() -> dict[str, int]:
    """MiB of VmRSS, VmHWM, RssAnon, RssFile of this process."""
    keys = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in keys:
            out[key] = int(value.split()[0]) // 1024
    return out


def _workers_uss() -> int:
    """MiB of private memory of this process's children (the DataLoader workers)."""
    me = os.getpid()
    return sum(startup._memory_kib(p, private=True) for p in startup._tree_pids(me) if p != me) // 1024


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]  # noqa: E501


def _heap() -> str:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return "-"
    return f"{m.uordblks >> 20} / {m.fordblks >> 20} / {m.hblkhd >> 20}"


class Probe:
    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.peak = 0
        self.rows: list[tuple[Any, ...]] = []
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, _status()["VmRSS"] + _workers_uss())
            time.sleep(0.02)

    def mark(self, name: str) -> None:
        s, workers = _status(), _workers_uss()
        row = (name, f"{time.perf_counter() - self.began:.1f}", s["VmRSS"], s["VmHWM"], s["RssAnon"], s["RssFile"],
               workers, max(self.peak, s["VmRSS"] + workers), _heap())  # fmt: skip
        self.rows.append(row)
        print("[stage] " + " | ".join(map(str, row)), file=sys.stderr, flush=True)
        self.peak = 0

    def table(self) -> str:
        head = ("stage", "s", "RSS", "HWM", "anon", "file", "workers' USS", "peak since previous, rank",
                "heap in use / free / mmapped")  # fmt: skip
        lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 2) + "---|"]
        return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in self.rows])


def _after(owner: Any, name: str, probe: Probe, label: Any) -> None:
    """Mark `label` (or label(result)) after each call of owner.name."""
    real = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        probe.mark(label(args[0]) if callable(label) else label)
        return result

    setattr(owner, name, wrapped)


def run(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m imgcls.bench.stages", description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="dali_cpu")
    parser.add_argument("--resume", action="store_true", help="resume the run left by an earlier start")
    args, rest = parser.parse_known_args(argv)
    bench = startup.parse_args(rest)
    tree = startup.build_tree(bench.source, bench.dir, bench.classes, bench.train, bench.val)
    run_dir = bench.dir / "runs" / f"stages-{args.backend}"
    overrides = startup.train_overrides(tree, args.backend, run_dir, bench, args.resume)

    probe = Probe()
    import lightning as L  # noqa: N812

    import imgcls.run.train
    from imgcls.data.torchvision.backend import TorchvisionBackend
    from imgcls.training.module import ClassificationModule

    if args.backend.startswith("dali"):
        import nvidia.dali.plugin.pytorch  # noqa: F401 - what the backend imports

        from imgcls.data.dali import backend as dali
        from imgcls.data.file_list import FileList

        _after(FileList, "__init__", probe, lambda files: f"file list ({len(files)} files)")
        _after(dali.DaliBackend, "loader", probe, "loader built (DALI ran its first batch)")
    else:
        _after(TorchvisionBackend, "dataset", probe, "file list (ImageFolder)")
        _after(TorchvisionBackend, "loader", probe, "loader built")
    probe.mark("imports")
    steps = {"n": 0}
    forward = ClassificationModule.training_step

    def training_step(self: Any, *a: Any, **k: Any) -> Any:
        first = steps["n"] == 0
        if first:
            probe.mark("first batch in the step")
        out = forward(self, *a, **k)
        if first:
            probe.mark("first forward")
        steps["n"] += 1
        return out

    class Marks(L.Callback):
        def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if steps["n"] == 1:
                probe.mark("first backward")

        def on_train_batch_end(self, trainer: L.Trainer, *_: Any) -> None:
            if steps["n"] == 1:
                probe.mark("first step done")

    real_callbacks = imgcls.run.train.training_callbacks

    def training_callbacks(*a: Any, **k: Any) -> Any:
        callbacks, report = real_callbacks(*a, **k)
        return [*callbacks, Marks()], report

    imgcls.run.train.training_callbacks = training_callbacks
    sys.argv = [str(startup.REPO / "train.py"), *overrides]
    try:
        # patch.object: mypy refuses a plain assignment to a method, which this wrapper for the run is.
        with mock.patch.object(ClassificationModule, "training_step", training_step):
            runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code:
            raise
    probe.mark("end")
    print(probe.table())
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")


if __name__ == "__main__":
    run(sys.argv[1:])
