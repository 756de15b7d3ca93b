"""`python -m imgcls.bench.startup SOURCE [--classes 1000 --train 1281 --val 50]`: time to first training step.

Builds an ImageNet-shaped folder (`train/` and `val/` with CLASSES class folders, TRAIN and VAL files each;
1,281,000 + 50,000 files by default) out of the photos found under SOURCE, with hard links, so it costs
directory entries but no image data. The tree (`DIR/tree`) and the training runs (`DIR/runs`) live in a
folder this benchmark owns (`--dir`, default `$IMGCLS_CACHE/startup-<classes>x<train>x<val>`, marked by a
`.imgcls-startup-bench` file); it writes nowhere else, and refuses a `--dir` that exists without its marker.

Then, for each backend, it starts the real training entry (`python train.py data=folder ...`, resnet18 at
a small image size, one optimizer step, no validation) as a subprocess, and resumes that run once from its
`last.ckpt` for one more step (what a requeued job does). With `--limit-train-batches K`, the first start trains one
epoch of K steps instead (trainer.limit_train_batches, as gpu-check's rows and short trials do), and the resumed start
begins the next epoch, after one that the first start left K steps in, and stops after its first step.
Per start it prints:
- time to first step: from the spawn until the run's report.json appears. The report callback writes it
  at the end of the training epoch, which `trainer.max_steps` ends right after the step: everything from
  Python's start to the first optimizer step, and nothing of the exit (with --limit-train-batches, the first
  start's row runs to the end of its K-step epoch).
- exit: the whole process, for reference.
- peak RSS: the largest resident set of any one process of the run (ru_maxrss of the reaped children,
  taken in a fresh wrapper process per start so that earlier starts do not count).
- peak rank memory: the largest sum, sampled every 0.1 s, of the main process's resident set and its
  DataLoader workers' private memory (USS: Private_Clean + Private_Dirty of /proc/PID/smaps_rollup). The
  workers are forked, so the pages they share with the main process count once; unlike PSS, it does not
  depend on other processes of the machine mapping the same libraries.
- `--devices N`: N DDP ranks on gloo (Lightning starts ranks 1.. as new processes of train.py; a process whose
  command line differs from its parent's is a rank, one with its parent's command line a forked loader worker).
  The peak memory is then per rank (the largest over ranks, and each rank's in the JSON rows); the time to
  first step is rank 0's, which the first step's all-reduce keeps level with every other rank's.

The load average is printed with the table: other processes on the machine slow every row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from imgcls.errors import ConfigError, DataError, UserError

REPO = Path(__file__).resolve().parents[3]
MARKER = ".imgcls-startup-bench"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
# One wrapper process per start: ru_maxrss of RUSAGE_CHILDREN is a running maximum over everything a
# process ever reaped, so a long-lived benchmark process would report the first start's peak for all.
_WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.call(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def default_cache() -> Path:
    return Path(os.environ.get("IMGCLS_CACHE") or Path.home() / ".cache" / "imgcls").expanduser()


def photos(source: Path) -> list[Path]:
    found = sorted(p for p in source.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not found:
        raise DataError(f"{source} holds no .jpg/.jpeg/.png files to build the benchmark tree from")
    return found


def build_tree(source: Path, bench_dir: Path, classes: int, train: int, val: int) -> Path:
    """BENCH_DIR/tree/{train,val}/nNNNNNNNN/* as hard links to SOURCE's photos, reused when already complete."""
    done, tree = bench_dir / MARKER, bench_dir / "tree"
    spec = {"source": str(source.resolve()), "classes": classes, "train": train, "val": val}
    if bench_dir.exists() and not done.is_file():
        raise ConfigError(f"--dir {bench_dir} exists and was not made by this benchmark (no {MARKER}); pick another")
    bench_dir.mkdir(parents=True, exist_ok=True)
    done.touch()  # ours from now on; the spec goes in once the tree is complete
    if tree.exists():
        if json.loads(done.read_text() or "{}") == spec:
            return tree
        shutil.rmtree(tree)  # ours (under the marked folder), built with other sizes or left incomplete
        done.write_text("")
    files = photos(source)
    tree.mkdir()
    link: Any = os.link
    try:
        os.link(files[0], tree / ".probe")
        (tree / ".probe").unlink()
    except OSError:  # another filesystem: symlinks cost the same directory entries, plus one lookup an open
        link = os.symlink
        print(f"{tree} is not on the filesystem of {source}: symbolic links instead of hard links")
    n = 0
    for split, per_class in (("train", train), ("val", val)):
        for c in range(classes):
            folder = tree / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                photo = files[n % len(files)]
                link(photo.resolve(), folder / f"n{c:08d}_{i:05d}{photo.suffix}")
                n += 1
    done.write_text(json.dumps(spec))
    return tree


def _memory_kib(pid: int, private: bool) -> int:
    """RSS, or USS when `private`, of one process (0 once it has gone)."""
    fields = ("Private_Clean:", "Private_Dirty:") if private else ("Rss:",)
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0
    return sum(int(line.split()[1]) for line in lines if line.startswith(fields))


def _tree_pids(root: int) -> list[int]:
    return [pid for pid, _ in _tree(root)]


def _tree(root: int) -> list[tuple[int, int]]:
    """(pid, parent pid) of ROOT and every descendant, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [(root, 0)]
    while todo:
        pid, parent = todo.pop()
        tree.append((pid, parent))
        todo.extend((child, pid) for child in children.get(pid, []))
    return tree


def train_overrides(tree: Path, backend: str, run_dir: Path, args: argparse.Namespace, resume: bool) -> list[str]:
    """The train.py overrides of one start (also used by imgcls.bench.stages)."""
    return [
        "model=resnet18",
        "hardware=cpu",
        "data=folder",
        f"data.root={tree}",
        f"data.backend={backend}",
        f"data.num_workers={args.workers}",
        f"data.batch_size={args.batch_size}",
        f"recipe.global_batch_size={args.batch_size * args.devices}",
        *([f"trainer.devices={args.devices}", "trainer.accelerator=cpu"] if args.devices > 1 else []),
        f"model.image_size={args.image_size}",
        *(
            [f"trainer.limit_train_batches={args.limit_train_batches}"]
            + ([f"trainer.max_steps={args.limit_train_batches + 1}"] if resume else ["trainer.max_epochs=1"])
            if args.limit_train_batches
            else [f"trainer.max_steps={2 if resume else 1}"]
        ),
        "trainer.limit_val_batches=0",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "callbacks.progress_bar=none",
        "logger=none",
        f"hydra.run.dir={run_dir}",
        *(["ckpt_path=last"] if resume else []),
        *args.overrides,
    ]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _ranks_memory_kib(tree: list[tuple[int, int]]) -> list[int]:
    """Per rank, its main process's RSS plus its forked workers' USS. `tree`: train.py's process tree (_tree),
    parents before children. A process with its parent's command line is a forked worker of that rank."""
    commands = {pid: _cmdline(pid) for pid, _ in tree}
    rank_of: dict[int, int] = {}
    memory: list[int] = []
    for pid, parent in tree:
        if parent in rank_of and commands[pid] == commands.get(parent):
            rank_of[pid] = rank_of[parent]
            memory[rank_of[pid]] += _memory_kib(pid, private=True)
        else:
            rank_of[pid] = len(memory)
            memory.append(_memory_kib(pid, private=False))
    return memory


def start(tree: Path, backend: str, run_dir: Path, args: argparse.Namespace, resume: bool) -> dict[str, Any]:
    """One start of train.py; returns seconds to the first step and to exit, peak RSS and PSS in MiB."""
    overrides = train_overrides(tree, backend, run_dir, args, resume)
    report = run_dir / "report.json"
    report.unlink(missing_ok=True)  # the resumed start writes it again
    command = [sys.executable, "-c", _WRAPPER, sys.executable, str(REPO / "train.py"), *overrides]
    began = time.perf_counter()
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_step, peak_ranks = None, [0] * args.devices
    while child.poll() is None:
        if first_step is None and report.exists():
            first_step = time.perf_counter() - began
        ranks = _ranks_memory_kib(_tree(child.pid)[1:])  # [1:]: not the wrapper; train.py, its ranks, workers
        for r, kib in enumerate(ranks[: args.devices]):
            peak_ranks[r] = max(peak_ranks[r], kib)
        time.sleep(0.1)
    out, err = child.communicate()
    elapsed = time.perf_counter() - began
    if child.returncode != 0:
        tail = "\n".join((out + err).strip().splitlines()[-15:])
        raise UserError(f"{backend} start failed (exit {child.returncode}):\n{tail}")
    if first_step is None:  # ended between two polls
        first_step = elapsed
    return {
        "first_step_s": first_step,
        "exit_s": elapsed,
        "peak_rss_mib": int(err.strip().splitlines()[-1]) / 1024,
        "peak_rank_mib": max(peak_ranks) / 1024,
        "peak_each_rank_mib": [round(kib / 1024) for kib in peak_ranks],
    }


def table(rows: list[tuple[str, str, dict[str, float]]]) -> str:
    lines = [
        "| backend | start | time to first step (s) | process exit (s) | peak RSS, largest process (MiB) "
        "| peak rank memory, RSS + workers' USS (MiB) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for backend, kind, r in rows:
        lines.append(
            f"| {backend} | {kind} | {r['first_step_s']:.1f} | {r['exit_s']:.1f} | {r['peak_rss_mib']:.0f} "
            f"| {r['peak_rank_mib']:.0f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m imgcls.bench.startup", description=__doc__.split("\n")[0])
    parser.add_argument("source", type=Path, help="a folder of photos (searched recursively)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--train", type=int, default=1281, help="train files per class")
    parser.add_argument("--val", type=int, default=50, help="val files per class")
    parser.add_argument("--dir", type=Path, default=None, help="a folder this benchmark owns (tree and runs)")
    parser.add_argument("--backends", default="torchvision,dali_cpu")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="data.num_workers (the cpu profile's default)")
    parser.add_argument("--devices", type=int, default=1, help="DDP ranks (gloo, on this machine's CPUs)")
    parser.add_argument(
        "--limit-train-batches", type=int, default=0, help="K: epochs of K steps; the resumed start opens epoch 2"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument(
        "--no-disk-warmup", action="store_true", help="skip the untimed import that reads the libraries from disk"
    )
    parser.add_argument("overrides", nargs="*", help="more train.py overrides for every start (KEY=VALUE)")
    args = parser.parse_intermixed_args(argv)
    for name in ("classes", "train", "val", "image_size", "batch_size", "devices"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if not args.source.is_dir():
        raise ConfigError(f"{args.source} is not a folder of photos")
    if args.dir is None:
        args.dir = default_cache() / f"startup-{args.classes}x{args.train}x{args.val}"
    return args


def run(args: argparse.Namespace) -> list[tuple[str, str, dict[str, float]]]:
    began = time.perf_counter()
    tree = build_tree(args.source, args.dir, args.classes, args.train, args.val)
    total = args.classes * (args.train + args.val)
    print(f"{tree}: {args.classes} classes, {total} files ({time.perf_counter() - began:.0f} s to build or check)")
    if not args.no_disk_warmup:  # untimed: the first process to import torch, Lightning and DALI reads them from disk
        subprocess.run(
            [sys.executable, "-c", "import imgcls.run.train, imgcls.data.backends, nvidia.dali"], check=False
        )
    rows = []
    for backend in args.backends.split(","):
        run_dir = args.dir / "runs" / backend
        if run_dir.exists():
            shutil.rmtree(run_dir)  # our own run dir from an earlier benchmark
        for kind, resume in (("first", False), ("resumed", True)):
            result = start(tree, backend, run_dir, args, resume)
            shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}
            print(f"{backend} {kind}: {json.dumps(shown)}", flush=True)
            rows.append((backend, kind, result))
    return rows


def main(argv: list[str] | None = None) -> None:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        rows = run(args)
        print(table(rows))
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
        if args.json:
            args.json.write_text(json.dumps([{"backend": b, "start": k, **r} for b, k, r in rows], indent=1))
    except UserError as exc:
        print(f"imgcls: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
