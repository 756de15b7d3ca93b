"""Shared fixtures: Hydra composition of the real configs, small real JPEG folders, run helpers."""

from __future__ import annotations

import copy
import faulthandler
import functools
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict
from PIL import Image

import imgcls.config.compose  # registers the config resolvers
from tests import warm_python

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
TEST_DATA = ROOT / "tests" / "data"

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


def _compute_threads() -> int:
    """The cores of this machine shared among pytest-xdist's workers (`make test` runs 2 on 2 cores)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, len(os.sched_getaffinity(0)) // workers)


# torch's default of one OpenMP thread per core oversubscribes the cores when each xdist worker (or its train.py
# subprocess) computes at the same time: the threads spin waiting for a core the other worker holds. Set before
# torch is imported, here and (through the environment) in every subprocess; DDP tests set 1 themselves.
# Measured in docs/testing.md.
if "OMP_NUM_THREADS" not in os.environ or os.environ.get("IMGCLS_TEST_THREADS") == os.environ["OMP_NUM_THREADS"]:
    # (not a value the user set; xdist's workers inherit the value the controller process set here)
    os.environ["OMP_NUM_THREADS"] = os.environ["IMGCLS_TEST_THREADS"] = str(_compute_threads())
if "torch" in sys.modules:  # imported by a plugin before this file: its thread pool is already sized
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# Compositions shared by the xdist workers of one pytest run (and the processes they start): a folder the
# controller makes before the workers start (they inherit the variable) and removes at the end, keyed by the
# overrides and a digest of everything composition reads.
COMPOSE_CACHE_VARIABLE = "IMGCLS_TEST_COMPOSE_CACHE"
_OWN_COMPOSE_CACHE = pytest.StashKey[str]()


# A test still running after this long (the longest takes ~2.5 min) prints every thread's stack and ends its
# process (xdist reports the test as crashed and starts a new worker). A deadlock that holds the GIL cannot be
# interrupted from Python (pytest-timeout's methods both need it); faulthandler's watchdog is a C thread. Without
# it, one such hang (a DALI pipeline destroyed while its fn.python_function waited for the GIL) kept a CI run
# waiting until CI's own limit, naming no test.
TEST_DEADLINE_S = 600
_WATCHDOG_OUT = pytest.StashKey[Any]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    faulthandler.dump_traceback_later(TEST_DEADLINE_S, exit=True, file=item.config.stash[_WATCHDOG_OUT])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_configure(config: pytest.Config) -> None:
    # The real stderr, not pytest's capture of it (what a process that exits leaves there is lost).
    config.stash[_WATCHDOG_OUT] = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")
    if not hasattr(config, "workerinput") and COMPOSE_CACHE_VARIABLE not in os.environ:
        os.environ[COMPOSE_CACHE_VARIABLE] = tempfile.mkdtemp(prefix="imgcls-compose-")
        config.stash[_OWN_COMPOSE_CACHE] = os.environ[COMPOSE_CACHE_VARIABLE]


def pytest_sessionfinish(session: pytest.Session) -> None:
    own = session.config.stash.get(_OWN_COMPOSE_CACHE, None)
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)


@functools.cache
def _composition_inputs() -> str:
    digest = hashlib.sha256()
    for path in sorted([*CONF.rglob("*.yaml"), ROOT / "src" / "imgcls" / "config" / "compose.py"]):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=256)
def _composed(overrides: tuple[str, ...], config_name: str) -> DictConfig:
    # Hydra spends ~0.35 s of CPU per composition; several test files compose the same configs (every
    # experiment: test_config_checks, test_plan_mode, test_configs, test_published_combinations, ...), on both
    # xdist workers. Loading a composed config back from YAML takes ~1/20 of that; callers get a deep copy.
    # imgcls.config.compose.compose_config, not Hydra's compose(): task_name is derived from Hydra's own config.
    folder = os.environ.get(COMPOSE_CACHE_VARIABLE)
    key = hashlib.sha256(repr((config_name, overrides, _composition_inputs())).encode()).hexdigest()
    cached = Path(folder or "/nonexistent") / f"{key}.yaml"
    if cached.is_file():
        cfg = OmegaConf.create(cached.read_text())
        OmegaConf.set_struct(cfg, True)  # as Hydra returns it
        return cfg
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = imgcls.config.compose.compose_config(config_name, list(overrides))
    if folder and Path(folder).is_dir():
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(OmegaConf.to_yaml(cfg))
        partial.replace(cached)  # whole or absent for the other worker
    return cfg


def compose_config(overrides: list[str], config_name: str = "train", run_dir: Path | None = None) -> DictConfig:
    """The config `python train.py OVERRIDES` would run with (run_dir pinned instead of Hydra's)."""
    cfg = copy.deepcopy(_composed(tuple(overrides), config_name))
    with open_dict(cfg):
        cfg.run_dir = str(run_dir) if run_dir else "/nonexistent-run-dir"
    return cfg


def make_image_folder(
    root: Path, classes: int = 3, train_per_class: int = 16, val_per_class: int = 6, size: tuple[int, int] = (48, 40)
) -> Path:
    """ROOT/{train,val}/class_k/*.jpg: real JPEG files whose colour depends on the class (learnable)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for k in range(classes):
            folder = root / split / f"class_{k}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                base = np.zeros((size[1], size[0], 3), np.uint8)
                base[..., k % 3] = 200
                noise = rng.integers(0, 55, base.shape, dtype=np.uint8)
                Image.fromarray(base + noise).save(folder / f"{i:03d}.jpg", quality=90)
    return root


def sample_photos(out: Path, count: int) -> list[Path]:
    """`count` real photos as JPEG files in `out`: scikit-learn's two sample photos (640x427, CC BY 2.0; credits in
    sklearn/datasets/images/README.txt), byte for byte, then crops of them at varied sizes, aspect ratios and
    offsets, re-encoded at quality 90. The crops keep the photos' texture and JPEG statistics, which generated
    images lack; every shorter side is at least 260 px, so a 256-resize and a 224-crop both downscale."""
    from sklearn.datasets import images as sklearn_images

    folder = Path(sklearn_images.__file__).parent
    sources = [folder / "china.jpg", folder / "flower.jpg"]
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        source = sources[i % 2]
        target = out / f"photo_{i:02d}_{source.stem}.jpg"
        if i < 2:
            shutil.copyfile(source, target)
        else:
            with Image.open(source) as photo:
                width, height = int(rng.integers(300, 641)), int(rng.integers(260, 428))
                left, top = int(rng.integers(0, 641 - width)), int(rng.integers(0, 428 - height))
                photo.convert("RGB").crop((left, top, left + width, top + height)).save(target, quality=90)
        paths.append(target)
    return paths


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("images"))


def tiny_overrides(data_root: Path, *extra: str) -> list[str]:
    """A seconds-long CPU run on the folder `data_root`: the `debug=tiny` config (conf/debug/tiny.yaml), which
    users run too, plus what a test needs. The network is timm's `test_resnet` (a 3 MB ResNet) unless the test
    names one (`model=...` or `model.arch=...`): ResNet18's 90 MB checkpoints and its steps cost each run ~2 s
    more, and most tests are not about the network."""
    names_network = any(o.startswith(("model=", "model.arch=", "+model.arch=")) for o in extra)
    return ["debug=tiny", f"data.root={data_root}", *([] if names_network else ["model.arch=test_resnet"]), *extra]


def run_cli(
    script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run train.py / evaluate.py as a user would, in a real process (of the warm server: tests/warm_python.py)."""
    return warm_python.run([ROOT / script, *args], env={"WANDB_MODE": "offline", **(env or {})}, timeout=timeout)


def read_report(run_dir: Path) -> dict[str, Any]:
    import json

    return json.loads((run_dir / "report.json").read_text())


def tiny_run(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    """Train the tiny checkpoint once per session: RUN/checkpoints/{last,best}.ckpt and RUN/report.json."""
    run_dir = tmp_path_factory.getbasetemp() / "imgcls-tiny-run"
    if not (run_dir / "report.json").is_file() or not (run_dir / "checkpoints" / "last.ckpt").is_file():
        import imgcls.run.train

        imgcls.run.train.run(compose_config(tiny_overrides(image_folder, "recipe.ema_decay=0.9"), run_dir=run_dir))
    return run_dir


def run_clis(cases: dict[str, list[str]], timeout: float = 600) -> dict[str, subprocess.CompletedProcess]:
    """Run several CLI invocations as a user would, concurrently, as real processes of the warm server
    (tests/warm_python.py)."""
    procs = {name: warm_python.start(list(args), env={"WANDB_MODE": "offline"}) for name, args in cases.items()}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=timeout)
        results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("imgcls: error:")]
    assert len(lines) == 1, result.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env() -> dict[str, str]:
    """This environment without any launcher variables (pytest itself might run under torchrun/SLURM)."""
    launcher = ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if k not in launcher and not k.startswith(("TORCHELASTIC", "SLURM"))}
    return {**env, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}


def run_two_gloo_ranks(script: Path, outputs: list[Path], timeout: float) -> None:
    """SCRIPT OUTPUT as ranks 0 and 1 of a gloo world of two (MASTER_ADDR/PORT, WORLD_SIZE, RANK set), each with its
    own output path; both must exit 0 within TIMEOUT seconds."""
    from tests import warm_python

    env = {**clean_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    procs = [warm_python.start([script, out], {"RANK": str(rank)}, base_env=env) for rank, out in enumerate(outputs)]
    for proc in procs:
        _, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err[-3000:]


# The longest tests (minutes on 2 cores; docs/testing.md lists the slowest) start first, then the other slow ones,
# then the quick ones. `make test` runs pytest-xdist with --dist loadfile (a file's tests on one worker, so its
# module-scoped runs are made once), which hands out the files in the order of their first test here: the files
# of quick tests fill the gaps at the end instead of one worker waiting alone for a long file that started last.
# (A test listed here uses no costly module-scoped fixture: taken out of its module's order, it would set that
# fixture up a second time.)
LONGEST_FIRST = (
    "test_demo_reaches_90_percent", "test_compile_trains_under_ddp_and_keeps_checkpoint_keys",
    "test_every_published_combination_trains_validates_and_resumes_on_two_ranks",
    "test_benchmark_builds_its_tree_in_its_own_folder_and_times_both_starts",
    "test_ddp_run_stopped_mid_epoch_resumes_to_identical_weights",
    "test_two_processes_stopped_inside_a_shard_resume_to_identical_weights_steps_and_lr",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        if item.originalname in LONGEST_FIRST:
            return LONGEST_FIRST.index(item.originalname)
        return len(LONGEST_FIRST) + (0 if item.get_closest_marker("slow") else 1)

    items.sort(key=rank)  # stable: file order within each rank
