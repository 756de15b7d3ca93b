"""Crash-safe checkpoints, mid-epoch resume, preemption signals, NaN loss, disk faults, a failing DDP rank."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from imgcls.cli import guarded
from imgcls.data.torchvision.samplers import RankSampler, ResumableDataLoader
from imgcls.errors import StorageError
from imgcls.run.train import run
from imgcls.training.checkpoint import AtomicCheckpointIO
from tests import warm_python
from tests.conftest import ROOT, compose_config, make_image_folder, run_cli, tiny_overrides


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"), classes=3, train_per_class=8, val_per_class=2)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("imgcls: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    return lines[0]


# --- checkpoint files -------------------------------------------------------------------------------------
class _DiskFull:
    def __reduce__(self):  # torch.save pickles this after writing part of the file
        raise OSError(errno.ENOSPC, "No space left on device")


def test_failed_save_leaves_the_previous_checkpoint_and_no_temp_file(tmp_path: Path) -> None:
    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"w": torch.ones(1000)}, path)
    before = sha(path)
    with pytest.raises(StorageError, match="No space left on device.*previous checkpoint is intact"):
        io.save_checkpoint({"w": torch.zeros(1000), "x": _DiskFull()}, path)
    assert sha(path) == before and list(tmp_path.iterdir()) == [path]
    assert torch.equal(torch.load(path)["w"], torch.ones(1000))


@pytest.mark.slow
def test_full_disk_while_saving_is_one_line_and_keeps_last_ckpt(data: Path, tmp_path: Path) -> None:
    argv = [*tiny_overrides(data, "recipe.epochs=2"), f"hydra.run.dir={tmp_path}"]
    assert run_cli("train.py", *argv, "trainer.max_epochs=1").returncode == 0
    last = tmp_path / "checkpoints" / "last.ckpt"
    before = sha(last)
    limit = 1 << 20  # 1 MB: logs and charts fit, a 3 MB test_resnet checkpoint does not (EFBIG, as on a full disk)
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *argv, "ckpt_path=last"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    assert result.returncode == 4, result.stderr[-2000:]
    assert "could not write checkpoint" in one_error_line(result.stderr)
    assert "previous checkpoint is intact" in result.stderr
    assert sha(last) == before and not list((tmp_path / "checkpoints").glob(".last.ckpt.*.tmp"))


@pytest.mark.slow
def test_unwritable_run_dir(data: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "file").write_text("a file, not a directory")  # root ignores chmod, so use a path under a file
    with pytest.raises(SystemExit) as exit_info:
        guarded(run, compose_config(tiny_overrides(data), run_dir=tmp_path / "file" / "run"))
    assert exit_info.value.code == 4
    assert "is not writable" in one_error_line(capsys.readouterr().err)


# --- mid-epoch position -----------------------------------------------------------------------------------
def _loader(n: int = 40, batch: int = 4, world: int = 1, rank: int = 0) -> ResumableDataLoader:
    sampler = RankSampler(n, rank, world, shuffle=True, seed=7, drop_last=True)

    def collate(samples: list) -> tuple:
        return torch.tensor([x for x, _ in samples]), torch.tensor([y for _, y in samples]), []

    return ResumableDataLoader(
        [(i, i) for i in range(n)], batch_size=batch, sampler=sampler, drop_last=True, collate_fn=collate
    )


@pytest.mark.parametrize("stop_after", [1, 3, 9])
def test_resumed_epoch_neither_repeats_nor_skips(stop_after: int) -> None:
    full = _loader()
    full.sampler.set_epoch(2)
    expected = [x.tolist() for x, _ in full]
    first = _loader()
    first.sampler.set_epoch(2)
    it, seen = iter(first), []
    for _ in range(stop_after):
        seen.append(next(it)[0].tolist())
    state = first.state_dict()
    resumed = _loader()  # a new process: a fresh loader, the state from the checkpoint
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(2)  # Lightning calls set_epoch with the same epoch
    seen += [x.tolist() for x, _ in resumed]
    assert seen == expected
    next_epoch = _loader()
    next_epoch.sampler.set_epoch(3)
    resumed.sampler.set_epoch(3)
    assert [x.tolist() for x, _ in resumed] == [x.tolist() for x, _ in next_epoch]  # then whole epochs again


def test_state_saved_at_epoch_end_starts_the_next_epoch() -> None:
    loader = _loader()
    loader.sampler.set_epoch(4)
    list(loader)
    resumed = _loader()
    resumed.load_state_dict(loader.state_dict())
    fresh = _loader()
    fresh.sampler.set_epoch(5)
    # Lightning creates the resumed iterator before set_epoch: it must already be epoch 5, from its start.
    assert [x.tolist() for x, _ in resumed] == [x.tolist() for x, _ in fresh]


# --- numerical faults -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_nan_loss_stops_naming_step_and_lr_and_keeps_the_last_good_checkpoint(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    overrides = tiny_overrides(
        data,
        "recipe.epochs=3",
        "recipe.lr_per_256=1e12",
        "recipe.warmup_epochs=0",
        "callbacks.checkpoint.every_n_train_steps=1",
    )
    with pytest.raises(SystemExit) as exit_info:
        guarded(run, compose_config(overrides, run_dir=tmp_path))
    line = one_error_line(capsys.readouterr().err)
    assert exit_info.value.code == 3
    assert "train.loss is nan" in line or "train.loss is inf" in line
    assert " at step " in line and " with lr " in line and "last.ckpt" in line
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values() if v.is_floating_point())
    assert f"at step {ckpt['global_step']} " in line  # the checkpoint is the step right before the bad one


# --- signals ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_imgcls_handles_the_preemption_signals_for_the_whole_run(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From setup to teardown the handlers are imgcls's: Lightning's SIGTERM handler (a dist.broadcast inside a
    signal handler) was live in setup and teardown, and SIGUSR2 (submitit's) was not handled at all."""
    import lightning as L

    import imgcls.run.train
    from imgcls.callbacks import preemption

    seen: dict[str, list] = {}

    class Handlers(L.Callback):
        def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
            seen["setup"] = [signal.getsignal(s) for s in preemption.PREEMPTION_SIGNALS]

        def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
            seen["step"] = [signal.getsignal(s) for s in preemption.PREEMPTION_SIGNALS]

        def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
            seen["teardown"] = [signal.getsignal(s) for s in preemption.PREEMPTION_SIGNALS]

    real_build = imgcls.run.train.build_trainer
    monkeypatch.setattr(imgcls.run.train, "build_trainer", lambda cfg, plan, callbacks, loggers: real_build(
        cfg, plan, [*callbacks, Handlers()], loggers))  # fmt: skip
    before = [signal.getsignal(s) for s in preemption.PREEMPTION_SIGNALS]
    run(compose_config(tiny_overrides(data, "recipe.epochs=1"), run_dir=tmp_path))
    assert set(seen) == {"setup", "step", "teardown"}
    for when, handlers in seen.items():
        assert handlers == [preemption._handle] * 3, when  # noqa: SLF001
    assert [signal.getsignal(s) for s in preemption.PREEMPTION_SIGNALS] == before  # given back after the run


def _start(argv: list[str], env: dict[str, str] | None = None, script: str = "train.py") -> warm_python.WarmProcess:
    return warm_python.start([ROOT / script, *argv], env={"WANDB_MODE": "offline", **(env or {})})


# A signal test's run waits right after its first last.ckpt, at step 2 (_long_run saves every 2 steps), until the
# signal has reached imgcls's handler (tests/train_until_signalled.py; it creates its MARKER argument then), so the
# signal's save is at the next optimizer step on any machine's speed: step 3, which no periodic save is (every 2
# steps, and at the end of an epoch after its validation).
WAITER = "tests/train_until_signalled.py"
SIGNAL_STEP = 3


def _waiting(marker: Path, argv: list[str]) -> list[str]:
    """WAITER's arguments: MARKER, wait after the 1st last.ckpt, then train.py's."""
    return [str(marker), "1", *argv]


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _long_run(data: Path, run_dir: Path) -> list[str]:
    return [
        *tiny_overrides(data, "recipe.epochs=50", "callbacks.checkpoint.every_n_train_steps=2"),
        f"hydra.run.dir={run_dir}",
    ]


@pytest.mark.slow
def test_sigterm_saves_last_ckpt_and_exits_within_seconds(data: Path, tmp_path: Path) -> None:
    marker = tmp_path / "waiting"
    proc = _start(_waiting(marker, _long_run(data, tmp_path)), script=WAITER)
    last = tmp_path / "checkpoints" / "last.ckpt"
    _wait_for_file(marker, proc)  # waiting after its save at step 2
    mtime = last.stat().st_mtime_ns
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    elapsed = time.monotonic() - sent
    stderr = proc.stderr.read()
    assert code == 128 + signal.SIGTERM, stderr[-2000:]
    assert elapsed < 60
    assert "received signal 15: saving" in (tmp_path / "train.log").read_text()  # Hydra's log of the run
    assert last.stat().st_mtime_ns != mtime  # saved again after the periodic save at step 2
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == SIGNAL_STEP  # the signal's save: the next step, not a periodic one


def _fake_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in `scontrol` that appends each call's arguments to a file; returns (bin dir, that file)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.args"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    scontrol.chmod(0o755)
    return bin_dir, calls


@pytest.mark.slow
def test_sigusr1_under_slurm_saves_hpc_checkpoint_and_requeues(data: Path, tmp_path: Path) -> None:
    bin_dir, calls = _fake_scontrol(tmp_path)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "imgcls",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }
    run_dir, marker = tmp_path / "run", tmp_path / "waiting"
    proc = _start(_waiting(marker, _long_run(data, run_dir)), env, script=WAITER)
    _wait_for_file(marker, proc)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == 128 + signal.SIGUSR1, proc.stderr.read()[-2000:]  # saved, requeued, exited
    assert calls.read_text().splitlines() == ["requeue 4242"]
    (hpc,) = run_dir.glob("hpc_ckpt_*.ckpt")  # what Lightning resumes from when the requeued job starts
    assert sha(hpc) == sha(run_dir / "checkpoints" / "last.ckpt")
    assert torch.load(hpc, map_location="cpu", weights_only=False)["global_step"] == SIGNAL_STEP


@pytest.mark.slow
def test_submitit_sigusr2_in_a_single_task_job_saves_requeues_and_the_requeued_job_resumes(
    data: Path, tmp_path: Path
) -> None:
    """hydra/launcher=slurm (submitit) preempts with SIGUSR2, which imgcls did not handle (the job died mid-step
    without a checkpoint), and a single-task job's run dir was timestamped, so the requeued job (same
    SLURM_JOB_ID, same command, no hydra.run.dir) started from scratch in a new dir."""
    bin_dir, calls = _fake_scontrol(tmp_path)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "5150", "SLURM_NTASKS": "1",
           "SLURM_JOB_NAME": "sweep_job", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "WANDB_MODE": "offline"}  # fmt: skip
    argv = [ROOT / "train.py", *tiny_overrides(data, "recipe.epochs=50", "callbacks.checkpoint.every_n_train_steps=2")]
    marker = tmp_path / "waiting"
    proc = warm_python.start([ROOT / WAITER, *_waiting(marker, argv[1:])], env=env, cwd=tmp_path)
    run_dir = tmp_path / "outputs" / "train" / "5150"  # the job id: the same dir after the requeue
    _wait_for_file(marker, proc)
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=60) == 128 + signal.SIGUSR2, proc.stderr.read()[-2000:]
    assert calls.read_text().splitlines() == ["requeue 5150"]
    (hpc,) = run_dir.glob("hpc_ckpt_*.ckpt")
    saved_step = torch.load(hpc, map_location="cpu", weights_only=False)["global_step"]
    assert saved_step == SIGNAL_STEP
    # The requeued job: the same command and environment, trained to a few steps past the saved one.
    again = warm_python.run([*argv, f"trainer.max_steps={saved_step + 2}"], env=env, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Restoring states from the checkpoint path at" in again.stdout + again.stderr
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == saved_step + 2


@pytest.mark.slow
def test_submitit_local_executor_preempts_requeues_and_the_task_resumes(data: Path, tmp_path: Path) -> None:
    """The real Hydra submitit launcher and submitit's local executor (its controller process and the task it
    starts, with submitit's own SIGUSR2 handler installed before imgcls runs): SIGUSR2, the signal its controller
    sends before a timeout, saves last.ckpt at a step boundary and ends the task with submitit's requeue code;
    the controller starts the task again, which resumes from the checkpoint in the same sweep dir and finishes,
    and the sweep ends with 0. Before, the task exited 140 and the launcher died with submitit's
    UncompletedJobError ("has not produced any output"); a requeued task would have started from scratch."""
    sweep, marker = tmp_path / "sweep", tmp_path / "waiting"
    argv = [
        ROOT / "train.py", "-m", "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep}",
        "hydra.launcher.timeout_min=10",
        *tiny_overrides(data, "recipe.epochs=6", "callbacks.checkpoint.every_n_train_steps=1", "logger=csv"),
        # The task waits after its first last.ckpt until the signal is in (submitit's controller starts train.py
        # itself: the waiting goes in as a Hydra callback, tests/train_until_signalled.py); the requeued task,
        # which finds the marker, trains through. So the signal lands at step 2 on any machine's speed.
        "+hydra.callbacks.waiter._target_=tests.train_until_signalled.WaitAfterCheckpoint",
        f"+hydra.callbacks.waiter.marker={marker}",
    ]  # fmt: skip
    # The repository first (tests.train_until_signalled), the caller's PYTHONPATH after it, as warm_python does:
    # submitit's task is a fresh interpreter.
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    launcher = warm_python.start(argv, env={"WANDB_MODE": "offline", "PYTHONPATH": pythonpath}, cwd=tmp_path)
    _wait_for_file(marker, launcher)
    # Named for the job id, the pid of submitit's controller (beside the unexpanded "%j" it creates first).
    (folder,) = [f for f in (sweep / ".submitit").iterdir() if f.name.isdigit()]
    controller = int(folder.name)
    (task,) = Path(f"/proc/{controller}/task/{controller}/children").read_text().split()
    os.kill(int(task), signal.SIGUSR2)
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err[-3000:]
    log = (folder / f"{controller}_0_log.out").read_text()
    assert "received signal 12: saving" in log and "Restoring states from the checkpoint path at" in log, log[-3000:]
    hpc = sweep / "0" / "hpc_ckpt_1.ckpt"
    # The newest checkpoint by step (checkpoint.resume_checkpoint): the requeue's hpc link and last.ckpt hold the same
    # step (the same file, linked), and a tie resumes from last.ckpt.
    assert f"Restoring states from the checkpoint path at {sweep / '0' / 'checkpoints' / 'last.ckpt'}" in log
    saved = torch.load(hpc, map_location="cpu", weights_only=False)["global_step"]
    last = torch.load(sweep / "0" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved == 2 and last["global_step"] == 6 * 3  # 24 images / batch 8 = 3 steps an epoch
    rows = json.loads((sweep / "0" / "report.json").read_text())["epochs"]
    # Every epoch once, the last one at the last step (the row of an epoch whose last step was the saved one is
    # missing: Lightning resumes a checkpoint of an epoch's last step after its validation, see docs/reliability.md).
    epochs = [r["epoch"] for r in rows]
    assert epochs == sorted(set(epochs)) and len(epochs) >= 5 and rows[-1]["epoch"] == 5 and rows[-1]["step"] == 18


# WAITER waits after its own process's last.ckpt, and under DDP only rank 0 writes one: a rank 0 run through it
# would wait for a signal of its own, not rank 1's. This train.py for rank 1 waits in on_train_start (after it,
# imgcls's handler only sets the flag) until the signal has reached that handler, creating MARKER (argv[1]) when it
# starts waiting; rank 0 meanwhile waits for rank 1 in their next collective.
RANK_WAITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from imgcls.callbacks import preemption
from imgcls.cli import train_main
marker, sys.argv = Path(sys.argv[1]), [{train!r}, *sys.argv[2:]]
real_on_train_start = preemption.Preemption.on_train_start
def on_train_start(self, trainer, pl_module):
    real_on_train_start(self, trainer, pl_module)
    marker.write_text("waiting")
    deadline = time.monotonic() + 300  # bounds a hang only
    while preemption.received_signal() is None and time.monotonic() < deadline:
        time.sleep(0.01)
preemption.Preemption.on_train_start = on_train_start
train_main()
"""


@pytest.mark.slow
def test_sigusr1_to_one_ddp_rank_under_slurm_saves_at_one_step_and_requeues_once(data: Path, tmp_path: Path) -> None:
    """Two srun-style gloo ranks; SIGUSR1 reaches rank 1 only (Lightning's handler used to save inside the
    signal handler of that rank alone, its collectives waiting for a rank 0 that was elsewhere). Rank 1 gets it
    while it waits before its first step (RANK_WAITER), so its flag is in the first all-reduce of the flags,
    started at step SYNC_EVERY_N_STEPS and read at the next check, 2 * SYNC_EVERY_N_STEPS, on any machine's speed."""
    from imgcls.distributed import SYNC_EVERY_N_STEPS
    from tests.conftest import clean_env, free_port

    bin_dir, calls = _fake_scontrol(tmp_path)
    slurm = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "imgcls",
        "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
        "SLURM_NODELIST": "127.0.0.1", "MASTER_PORT": str(free_port()),
    }  # fmt: skip
    run_dir, marker, waiter = tmp_path / "run", tmp_path / "waiting", tmp_path / "rank_waiter.py"
    waiter.write_text(RANK_WAITER.format(root=str(ROOT), train=str(ROOT / "train.py")))
    argv = [*_long_run(data, run_dir), "data.batch_size=4", "trainer.devices=2"]
    scripts = [[ROOT / "train.py"], [waiter, marker]]  # rank 1 waits
    procs = [
        warm_python.start([*scripts[k], *argv], base_env=clean_env(),
                          env={**slurm, "SLURM_PROCID": str(k), "SLURM_LOCALID": str(k)})
        for k in range(2)
    ]  # fmt: skip
    try:
        _wait_for_file(marker, procs[1])
        procs[1].send_signal(signal.SIGUSR1)
        outputs = ["".join(proc.communicate(timeout=120)) for proc in procs]  # a hang fails here
    finally:
        for proc in procs:
            proc.kill() if proc.poll() is None else None
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 128 + signal.SIGUSR1, out[-3000:]
    steps = [int(out.split("received signal 10: saving ")[1].split(" at step ")[1].split()[0]) for out in outputs]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert steps[0] == steps[1] == ckpt["global_step"] == 2 * SYNC_EVERY_N_STEPS  # both ranks, the first agreement
    assert len(ckpt["callbacks"]["RNGState"]["ranks"]) == 2  # the gather inside the save met both ranks
    assert calls.read_text().splitlines() == ["requeue 4242"]  # once, from rank 0
    (hpc,) = run_dir.glob("hpc_ckpt_*.ckpt")
    assert sha(hpc) == sha(run_dir / "checkpoints" / "last.ckpt")


# --- distributed ------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torchvision", "dali_cpu"])
def test_bad_files_on_one_rank_keep_the_ranks_steps_equal(backend: str, tmp_path: Path) -> None:
    """Every file of rank 1's first batch is bad (data.on_bad_image=skip): that rank used to skip the batch and
    end its epoch one step early, leaving rank 0 waiting in DDP's next all-reduce. Now its next batch is taken
    once more, and both ranks take the same steps."""
    root = make_image_folder(tmp_path / "data", classes=3, train_per_class=8, val_per_class=2)
    files = sorted(str(p) for p in (root / "train").glob("*/*.jpg"))  # the torchvision and DALI readers' order
    if backend == "torchvision":
        sampler = RankSampler(len(files), rank=1, world_size=2, shuffle=True, seed=12345, drop_last=True)
        first_batch = [files[i] for i in list(sampler)[:4]]
    else:  # DALI's reader gives rank 1 the second half of the files (its part), shuffled within it
        first_batch = files[len(files) // 2 :]
    for path in first_batch:
        Path(path).write_bytes(b"")
    run_dir = tmp_path / "run"
    result = run_cli("train.py", *tiny_overrides(root, "data.batch_size=4", f"data.backend={backend}"),
                     "trainer.devices=2", "trainer.accelerator=cpu", f"hydra.run.dir={run_dir}",
                     timeout=240)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 2 * 3  # 2 epochs of 3 steps (24 images, 4 a rank)
    assert "skipping bad image" in result.stdout + result.stderr


@pytest.mark.slow
def test_ddp_rank_that_fails_does_not_hang_the_other(data: Path, tmp_path: Path) -> None:
    """Rank 1 meets a real bad file (data.on_bad_image=error) in its first batch; rank 0 must not wait forever."""
    root = tmp_path / "data"
    make_image_folder(root, classes=3, train_per_class=8, val_per_class=2)
    files = sorted(str(p) for p in (root / "train").glob("*/*.jpg"))  # ImageFolder's order
    first_of_rank1 = RankSampler(len(files), rank=1, world_size=2, shuffle=True, seed=12345, drop_last=True)
    bad = Path(files[next(iter(first_of_rank1))])
    bad.write_bytes(b"")
    started = time.monotonic()
    result = run_cli(
        "train.py",
        *tiny_overrides(root, "data.on_bad_image=error", "data.batch_size=4"),
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=300,
    )
    assert result.returncode != 0
    assert str(bad) in result.stderr
    assert time.monotonic() - started < 300
