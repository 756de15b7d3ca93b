"""Real processes for the tests' command lines without paying Python's imports for each one.

A `train.py`, `evaluate.py` or `python -m imgcls.*` process spends ~8 s of CPU importing torch, Lightning, timm and
torchvision before it reads its config (measured in docs/testing.md), and the suite starts dozens of them. The
warm server imports those libraries once per test process and forks a child per command: the child is a real
process (its own pid, process group, file descriptors, signals, exit code; Lightning's DDP launcher and torchrun
still start their ranks as fresh interpreters), which then runs the script as `__main__` the way `python SCRIPT`
does, and exits through the interpreter's own exit steps (thread joins, atexit handlers) before `os._exit`.

What a fork cannot give: a module that reads the environment or the working directory at import time sees the
server's. imgcls reads neither at import, and the child applies `OMP_NUM_THREADS` to torch's thread pool itself.
What the server's imports made for their process stays the server's (its finalizers), or is made anew in the child
(wandb's media folder, which a child's wandb.init would otherwise remove at its exit from under the others).
Tests about the interpreter itself (which modules a command imports) start `sys.executable` directly.

Hand-written because multiprocessing's forkserver runs functions of the parent's code, not a script's `__main__`
with argv, its own stdio files and a pid a test can signal; nothing in the standard library or pytest does that.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
SOCKET_VARIABLE = "IMGCLS_WARM_PYTHON_SOCKET"
# The shim is a stdlib-only script run by the real interpreter with -I -S (about 20 ms): `python [-u] SCRIPT.py
# ARGS` becomes a command of the warm server with the shim's own stdout, stderr, cwd and environment; the shim
# forwards the signals it gets, and exits as the command did (its death kills the command). Other forms (-m, -c,
# other options) exec the real interpreter.
SHIM = """
import os, signal, socket, sys, json
real, argv = {real!r}, sys.argv[1:]
path = os.environ.get({variable!r})
env = dict(os.environ)
if argv[:1] == ["-u"]:  # torchrun starts its workers unbuffered
    argv, env["PYTHONUNBUFFERED"] = argv[1:], "1"
if not path or not argv or not argv[0].endswith(".py"):
    argv = sys.argv[1:]
    os.execv(real, [real, *argv])
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(path)
me = os.getpid()
request = {{"argv": argv, "env": env, "cwd": os.getcwd(), "stdout": f"/proc/{{me}}/fd/1",
           "stderr": f"/proc/{{me}}/fd/2", "shim": sys.argv[0], "socket": path}}
conn.sendall((json.dumps(request) + "\\n").encode())
reader = conn.makefile()
pid = int(reader.readline())
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
    signal.signal(sig, lambda number, frame: os.kill(pid, number))
line = reader.readline()
code = int(line) if line else 1
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(me, -code)
sys.exit(code)
"""
# What a command imports before its work starts (imgcls.cli imports the mode's module by name).
# imgcls.plot draws the charts at the end of every run; s3fs is what Lightning's checkpoint callback imports to ask
# whether a path is object storage (~0.5 s a run each).
PRELOAD = (
    "imgcls.cli",
    "imgcls.run.train",
    "imgcls.run.evaluate",
    "imgcls.export",
    "imgcls.classify",
    "imgcls.plot",
    "s3fs",
)


# --- the server (runs in its own interpreter: python tests/warm_python.py SOCKET) -----------------------------
def serve(socket_path: str) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the supervisors
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(16)
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in readable:  # the test process closed our stdin: it ended
            return
        conn, _ = listener.accept()
        request = json.loads(conn.makefile().readline())
        if os.fork() == 0:
            listener.close()
            _supervise(conn, request)
        conn.close()


def _supervise(conn: socket.socket, request: dict) -> None:
    """Fork the command's process, tell the client its pid, then its exit code."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_command(request)
    conn.sendall(f"{pid}\n".encode())
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if select.select([conn], [], [], 0.05)[0] and conn.recv(1) == b"":
            # The client is gone (a killed shim, an ended test process): so is its command, with its children.
            os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
    try:
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    except OSError:
        pass
    os._exit(0)


def _run_command(request: dict) -> None:
    import runpy
    import traceback

    os.setpgid(0, 0)  # its own process group, as a client's timeout kills the group (DDP ranks included)
    # Appending: a command started through the shim writes to the files of the process that started it, as the
    # inherited descriptors of a fresh interpreter would, without overwriting that process's output.
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_APPEND),
                            (2, request["stderr"], os.O_WRONLY | os.O_APPEND)):  # fmt: skip
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    # Finalizers made before the fork belong to the server (wandb's media folder, made when timm imports wandb,
    # is one): a child that ran them at its exit would delete what the server and the other children still use.
    for finalizer in list(weakref.finalize._registry):
        finalizer.atexit = False
    wandb_media = sys.modules.get("wandb.sdk.data_types._private")
    if wandb_media is not None:  # wandb.init registers this folder's removal at exit: the child gets its own
        wandb_media.MEDIA_TMP.name = tempfile.mkdtemp("wandb-media")
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # Python processes this command starts as `sys.executable SCRIPT.py ...` (Lightning's DDP launcher starts
    # ranks 1..N-1 so) come from the server too, through the shim; anything else runs the real interpreter.
    sys.executable = request["shim"]
    os.environ[SOCKET_VARIABLE] = request["socket"]
    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    if "OMP_NUM_THREADS" in os.environ:  # OpenMP read the server's value when it was loaded
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    argv = request["argv"]
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    threading._shutdown()  # the interpreter's own exit steps: join threads, then run atexit handlers
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


# --- the client (in the test process) ---------------------------------------------------------------------------
class WarmProcess:
    """The part of subprocess.Popen the tests use, for a command the warm server started."""

    def __init__(self, conn: socket.socket, workdir: Path, args: list[str]) -> None:
        self.args = args
        self._conn, self._reader = conn, conn.makefile()
        self._stdout_path, self._stderr_path = workdir / "stdout", workdir / "stderr"
        self.pid = int(self._reader.readline())
        self.returncode: int | None = None
        self.stdout: IO[str] = open(self._stdout_path)  # noqa: SIM115 - read as the process writes
        self.stderr: IO[str] = open(self._stderr_path)  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self.returncode = int(self._reader.readline())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(self._reader.readline())
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.wait()
            raise
        return self.stdout.read(), self.stderr.read()


class WarmServer:
    """One server per test process, started on first use and ended with the test process."""

    def __init__(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="imgcls-warm-"))
        self._socket = self._dir / "server.sock"
        self._shim = self._dir / "python"
        self._shim.write_text(f"#!{sys.executable} -IS\n" + SHIM.format(real=sys.executable, variable=SOCKET_VARIABLE))
        self._shim.chmod(0o755)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__)), str(self._socket)], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        if self._proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the warm server did not start (exit {self._proc.wait()})")
        self._count = 0

    def start(self, argv: list[str], env: dict[str, str], cwd: Path) -> WarmProcess:
        self._count += 1
        workdir = self._dir / f"cmd{self._count}"
        workdir.mkdir()
        for name in ("stdout", "stderr"):
            (workdir / name).touch()
        request = {"argv": argv, "env": env, "cwd": str(cwd), "shim": str(self._shim), "socket": str(self._socket),
                   "stdout": str(workdir / "stdout"), "stderr": str(workdir / "stderr")}  # fmt: skip
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(self._socket))
        conn.sendall((json.dumps(request) + "\n").encode())
        return WarmProcess(conn, workdir, argv)

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        shutil.rmtree(self._dir, ignore_errors=True)  # the folder mkdtemp made for this server: socket, shim, stdio


_server: WarmServer | None = None
_server_lock = threading.Lock()


def warm_server() -> WarmServer:
    global _server
    with _server_lock:
        if _server is None:
            _server = WarmServer()
            atexit.register(_server.close)
        return _server


def start(
    argv: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT, base_env: dict[str, str] | None = None
) -> WarmProcess:
    """Start `python ARGV` (a script path, or -m MODULE, and its arguments) as a real process of the warm server,
    with the environment `base_env` (this process's by default) updated by `env`."""
    return warm_server().start([str(a) for a in argv], {**(base_env or os.environ), **(env or {})}, Path(cwd))


def shim() -> tuple[str, dict[str, str]]:
    """An interpreter path and the environment it needs, for a test that starts `python SCRIPT.py ...` with Popen's
    own arguments (a pseudo-terminal's descriptors): the script runs as a warm process, as in a warm process's own
    children."""
    server = warm_server()
    return str(server._shim), {SOCKET_VARIABLE: str(server._socket)}


@contextlib.contextmanager
def as_sys_executable() -> Iterator[None]:
    """Inside: `sys.executable SCRIPT.py ...` started by the code under test (gpu_check's rows) runs through the
    shim()."""
    path, environment = shim()
    saved = sys.executable, os.environ.get(SOCKET_VARIABLE)
    sys.executable = path
    os.environ.update(environment)
    try:
        yield
    finally:
        sys.executable = saved[0]
        if saved[1] is None:
            del os.environ[SOCKET_VARIABLE]
        else:
            os.environ[SOCKET_VARIABLE] = saved[1]


def run(
    argv: list[str],
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    timeout: float = 600,
    base_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """`python ARGV` to its end, as subprocess.run(..., capture_output=True, text=True) gives it."""
    proc = start(argv, env, cwd, base_env)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess([sys.executable, *argv], proc.returncode, out, err)


if __name__ == "__main__":
    serve(sys.argv[1])
