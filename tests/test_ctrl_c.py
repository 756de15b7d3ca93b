"""Ctrl-C (SIGINT) during training: the first saves last.ckpt at the next step boundary, says which step and how to
resume, and exits 130; a second stops at once. Lightning's own handling of Ctrl-C (a KeyboardInterrupt: "Detected
KeyboardInterrupt, attempting graceful shutdown", exit 1, nothing saved) is never reached. Real train.py processes,
signalled as a terminal signals them (tests/warm_python.py forwards a signal to the command it started)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from imgcls.distributed import SYNC_EVERY_N_STEPS
from tests import warm_python
from tests.conftest import ROOT, clean_env, free_port, run_cli, tiny_overrides

# train.py that waits right after its COUNT-th last.ckpt (argv[2]) until UNTIL (argv[3]) Ctrl-Cs have reached
# imgcls's handler (or a bound that only stops a hang), creating MARKER (argv[1]) when it starts waiting and
# MARKER.received when the first Ctrl-C is in: the signal lands at a known step on any machine's speed. With UNTIL=2
# the wait ends only by the second Ctrl-C stopping the process from inside it, away from any step boundary.
WAITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
import imgcls.training.checkpoint as checkpoint
from imgcls.callbacks import preemption
from imgcls.cli import train_main
marker, count, until = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sys.argv = [{train!r}, *sys.argv[4:]]
real_write_atomic, writes = checkpoint.write_atomic, [0]
def write_atomic(path, write, what="", durable=False):
    real_write_atomic(path, write, what, durable)
    if Path(path).name != "last.ckpt":
        return
    writes[0] += 1
    if writes[0] != count:
        return
    marker.write_text("waiting")
    deadline = time.monotonic() + 300
    while len(preemption._received) < until and time.monotonic() < deadline:
        if preemption._received:
            Path(str(marker) + ".received").touch()
        time.sleep(0.01)
checkpoint.write_atomic = write_atomic
train_main()
"""
STEPS_PER_EPOCH = 6  # the session's image_folder: 48 training images, batch 8


def _waiter(tmp_path: Path) -> Path:
    script = tmp_path / "waiter.py"
    script.write_text(WAITER.format(root=str(ROOT), train=str(ROOT / "train.py")))
    return script


def _run_args(image_folder: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        *tiny_overrides(image_folder, "recipe.epochs=50", "callbacks.checkpoint.every_n_train_steps=4", *extra),
        f"hydra.run.dir={run_dir}",
    ]


def _wait_for(path: Path, proc: warm_python.WarmProcess, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read()[-2000:] + proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def _global_step(ckpt: Path) -> int:
    return int(torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"])


@pytest.mark.slow
def test_ctrl_c_saves_the_step_it_reached_names_it_and_the_resume_then_resumes_quietly(
    image_folder: Path, tmp_path: Path
) -> None:
    """Ctrl-C in epoch 2 (while it waits after the epoch-1 save, the 2nd last.ckpt: step 4's periodic one is the
    1st) saves the next step, 7, and exits 130 (Lightning: exit 1, last.ckpt left at step 6, no hint); the run
    resumed from it prints no raw Lightning warning about its checkpoint folder."""
    run_dir, marker = tmp_path / "run", tmp_path / "waiting"
    args = _run_args(image_folder, run_dir)
    proc = warm_python.start([_waiter(tmp_path), marker, "2", "1", *args], env={"WANDB_MODE": "offline"})
    _wait_for(marker, proc)
    last = run_dir / "checkpoints" / "last.ckpt"
    assert _global_step(last) == STEPS_PER_EPOCH  # the waiting save: epoch 1's end
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    output = out + err
    assert proc.returncode == 130, output[-3000:]
    assert "Detected KeyboardInterrupt" not in output and "Traceback" not in output, output[-3000:]
    step = STEPS_PER_EPOCH + 1  # the next step boundary: mid-epoch 2
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == step and ckpt["epoch"] == 1
    assert "Ctrl-C: saving last.ckpt at the next step" in err
    assert f"saving {last} at step {step} and exiting" in output
    (resume,) = [line.split("resume: ", 1)[1] for line in output.splitlines() if "resume: python train.py" in line]
    assert f"hydra.run.dir={run_dir}" in resume and resume.endswith("ckpt_path=last"), resume
    assert f"at step {step} and exiting" in (run_dir / "train.log").read_text()  # also in the run's log file

    again = run_cli("train.py", *args, "ckpt_path=last", f"trainer.max_steps={step + 2}")
    output = again.stdout + again.stderr
    assert again.returncode == 0, output[-3000:]
    assert f"Restoring states from the checkpoint path at {last}" in output
    assert "exists and is not empty" not in output, output[-3000:]  # Lightning's model_checkpoint.py:881
    assert _global_step(last) == step + 2


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_without_saving(image_folder: Path, tmp_path: Path) -> None:
    """The first Ctrl-C arrives while the process waits after its step-4 save; the second, while it still waits
    (no step boundary comes), ends it at once with 130, last.ckpt untouched. Without imgcls's handler the first
    one already ended it through Lightning's KeyboardInterrupt path, exit 1."""
    run_dir, marker = tmp_path / "run", tmp_path / "waiting"
    proc = warm_python.start(
        [_waiter(tmp_path), marker, "1", "2", *_run_args(image_folder, run_dir)], env={"WANDB_MODE": "offline"}
    )
    _wait_for(marker, proc)
    last = run_dir / "checkpoints" / "last.ckpt"
    saved = last.read_bytes()
    proc.send_signal(signal.SIGINT)
    _wait_for(Path(f"{marker}.received"), proc, timeout=60)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)  # the waiter alone would hold it for 300 s
    elapsed = time.monotonic() - sent
    assert proc.returncode == 130, (out + err)[-3000:]
    assert elapsed < 20
    assert "Ctrl-C again: stopping now, without saving" in err
    assert "Detected KeyboardInterrupt" not in out + err and "received signal 2: saving" not in out + err
    assert last.read_bytes() == saved and _global_step(last) == 4


@pytest.mark.slow
def test_ctrl_c_to_a_ddp_run_saves_one_step_on_every_rank(image_folder: Path, tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches every process of its foreground group: here both ranks of Lightning's launcher
    (rank 1 through the warm server's shim, which forwards it). They agree on one step by the flags' deferred
    all-reduce (no collective on the step path), save once with both ranks' RNG states, and exit 130."""
    run_dir = tmp_path / "run"
    argv = [
        *tiny_overrides(image_folder, "recipe.epochs=50", "callbacks.checkpoint.every_n_train_steps=2",
                        "trainer.devices=2", "trainer.accelerator=cpu", "data.batch_size=4"),
        f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    env = {**clean_env(), "MASTER_PORT": str(free_port()), "WANDB_MODE": "offline"}
    proc = warm_python.start([ROOT / "train.py", *argv], base_env=env)
    last = run_dir / "checkpoints" / "last.ckpt"
    try:
        _wait_for(last, proc)  # both ranks are past step 2: in the training loop
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = out + err
    assert proc.returncode == 130, output[-3000:]
    assert "Detected KeyboardInterrupt" not in output and "Traceback" not in output, output[-3000:]
    steps = {int(line.split(" at step ")[1].split()[0]) for line in output.splitlines() if "received signal 2:" in line}
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert steps == {ckpt["global_step"]} and ckpt["global_step"] % SYNC_EVERY_N_STEPS == 0, output[-3000:]
    assert len(ckpt["callbacks"]["RNGState"]["ranks"]) == 2  # the save met both ranks


def test_forked_processes_leave_ctrl_c_to_the_run(tmp_path: Path) -> None:
    """A DataLoader worker is forked from the run's process and inherits its handlers; a terminal's Ctrl-C reaches
    it too. It must neither raise (a worker that ends makes the loader fail: "DataLoader worker exited
    unexpectedly") nor count as the run's signal."""
    script = tmp_path / "fork.py"
    script.write_text(
        "import os, signal, time\n"
        "from imgcls.callbacks import preemption\n"
        "with preemption.preemption_signals():\n"
        "    preemption._in_training_loop[0] = True\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(0.2)\n"
        "        os._exit(7 if not preemption._received else 8)\n"
        "    _, status = os.waitpid(child, 0)\n"
        "    print(os.waitstatus_to_exitcode(status), preemption.received_signal())\n"
    )
    result = warm_python.run([script], timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["7", "None"]  # the child went on, unsignalled; the parent got nothing


# A command whose start-up (check_command_line, which every command runs first) gets a real SIGINT from the
# terminal: the default handler raises KeyboardInterrupt there, as it would anywhere before training starts.
INTERRUPTED_AT_START = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
import imgcls.cli as cli
real_check = cli.check_command_line
def check_command_line(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)  # the signal lands in this sleep
    return real_check(*args, **kwargs)
cli.check_command_line = check_command_line
sys.argv = [{program!r}, *sys.argv[1:]]
getattr(cli, sys.argv.pop(1))()
"""


@pytest.mark.parametrize("command", ["train_main", "evaluate_main", "classify_main", "export_main"])
def test_ctrl_c_before_training_is_one_line_and_exit_130(command: str, tmp_path: Path) -> None:
    """Ctrl-C while a command starts (or while evaluate, classify or export run: nothing of theirs saves on a
    signal) ends in one line and exit 130, not a KeyboardInterrupt traceback."""
    import subprocess
    import sys

    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED_AT_START.format(root=str(ROOT), program=str(ROOT / "train.py")))
    # A terminal's Ctrl-C reaches a foreground command: the default disposition, which Python turns into
    # KeyboardInterrupt, even where this suite itself was started with SIGINT ignored (a shell's background job).
    result = subprocess.run(
        [sys.executable, str(script), command, "ckpt=none.ckpt"], cwd=tmp_path, env=clean_env(),
        capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == ["imgcls: error: interrupted (Ctrl-C) before anything was saved"]
