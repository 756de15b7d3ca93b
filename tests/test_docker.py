"""The Docker files, checked as far as a machine without a Docker engine allows: hadolint when it is
installed, every COPY source exists, the project is installed with the Makefile's extras, the GPU image
keeps the container's torch/torchvision/DALI, and `make docker` builds both files."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cpu"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def makefile_extras() -> str:
    match = re.search(r"uv pip install .* -e '(\.\[[^\]]+\])'", (ROOT / "Makefile").read_text())
    assert match, "the Makefile's install line changed: update this test and the Dockerfiles"
    return match.group(1)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist_and_cover_the_package(dockerfile: Path) -> None:
    copied = []
    for instruction, args in instructions(dockerfile):
        if instruction == "COPY":
            *sources, _dest = shlex.split(args)
            for source in sources:
                assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"
            copied += sources
    # What an editable install and `python train.py` need (src/imgcls/conf is a symlink to conf).
    for needed in ("pyproject.toml", "src", "conf", "train.py"):
        assert needed in copied, needed
    assert (ROOT / "src" / "imgcls" / "conf").resolve() == (ROOT / "conf").resolve()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_installs_the_project_like_the_makefile(dockerfile: Path) -> None:
    runs = " ".join(args for instruction, args in instructions(dockerfile) if instruction == "RUN")
    assert f"-e '{makefile_extras()}'" in runs
    assert instructions(dockerfile)[0][0] in ("ARG", "FROM")


def test_gpu_image_on_ngc_keeps_its_torch_and_dali() -> None:
    steps = instructions(DOCKERFILES[0])
    assert any(i == "FROM" and args.startswith("nvcr.io/nvidia/pytorch:") for i, args in steps)
    result = subprocess.run(
        [sys.executable, str(ROOT / "docker" / "ngc_requirements.py"), str(ROOT)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    names = {re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0] for line in result.stdout.split()}
    assert not names & {"torch", "torchvision"} and not any(n.startswith("nvidia-dali") for n in names)
    assert {"lightning", "hydra-core", "timm", "wandb", "matplotlib", "hydra-submitit-launcher", "pytest"} <= names
    runs = " ".join(args for i, args in steps if i == "RUN")
    assert "--no-deps -e" in runs  # the project itself must not pull PyPI's torch over the container's


def test_cpu_image_uses_cpu_torch_wheels() -> None:
    steps = instructions(DOCKERFILES[1])
    assert steps[0] == ("FROM", "python:3.11-slim")
    assert "download.pytorch.org/whl/cpu" in " ".join(args for i, args in steps if i == "RUN")


def test_make_docker_builds_both_images() -> None:
    # Run as a top-level make even under `make test`: an inherited MAKELEVEL/MAKEFLAGS makes make print
    # "Entering directory" lines among the commands.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    command = ["make", "--no-print-directory", "-n", "docker"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    commands = result.stdout.strip().splitlines()
    assert [c.split(" -f ")[1].split()[0] for c in commands] == ["docker/Dockerfile", "docker/Dockerfile.cpu"]
    assert all(c.startswith("docker build") and c.endswith(" .") for c in commands)


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed")
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile: Path) -> None:
    command = ["hadolint", "--failure-threshold", "error", str(dockerfile)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
