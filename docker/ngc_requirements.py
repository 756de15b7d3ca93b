"""Print the project's requirements (with `make install`'s extras) minus what NVIDIA's PyTorch
container already ships: torch, torchvision and DALI. Used by docker/Dockerfile."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

EXTRAS = ("dev", "export", "cluster")  # as the Makefile's install line: -e '.[dev,export,cluster]'
SHIPPED = ("torch", "torchvision", "nvidia-dali")  # in the NGC image, pinned by /etc/pip/constraint.txt


def requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    deps = list(project["dependencies"])
    for extra in EXTRAS:
        deps += project["optional-dependencies"][extra]
    name = lambda dep: re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower()  # noqa: E731
    return [d for d in deps if not any(name(d) == s or name(d).startswith(s + "-") for s in SHIPPED)]


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
    print("\n".join(requirements(root / "pyproject.toml")))
