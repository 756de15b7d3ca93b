"""The package layout rules: the layers (no module imports one of a later layer, not even inside a function or by a
"module:function" string that a command dispatches to), no import cycles, and the layout section of
docs/architecture.md names every module that exists and no module that does not."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LAYOUT = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
DISPATCH = re.compile(r"imgcls(\.\w+)+:\w+")

# The layers, lowest first (docs/architecture.md, "The layers"): a module may import its own layer and the ones before
# it. A module's layer is that of the longest prefix listed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "imgcls.errors",
            "imgcls.storage",
            "imgcls.distributed",
            "imgcls.typed_config",
            "imgcls.seeding",
            "imgcls.redaction",
        ),
    ),
    ("config", ("imgcls.config",)),
    ("data", ("imgcls.data",)),
    ("models", ("imgcls.models",)),
    ("quantization", ("imgcls.quantization",)),
    ("training", ("imgcls.training",)),
    ("callbacks", ("imgcls.callbacks",)),
    ("inference", ("imgcls.inference",)),
    ("export", ("imgcls.export",)),
    ("run", ("imgcls.run",)),
    ("bench", ("imgcls.bench",)),
    ("commands", ("imgcls.cli", "imgcls.classify", "imgcls.plot", "imgcls.export.__main__")),
]


def modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "imgcls").rglob("*.py"):
        if "conf" in path.relative_to(SRC).parts:
            continue
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Every imgcls import of every module, wherever it appears (module level, function, if-block), and every
    "imgcls.module:function" string (cli's modes import their module by name)."""
    mods = modules()
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("imgcls"):
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DISPATCH.fullmatch(node.value):
                targets = [node.value.split(":")[0]]
            graph[name] |= {t for t in targets if t in mods and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest prefix of `module`; -1 if no prefix is listed."""
    best, found = -1, ""
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(found):
                best, found = index, prefix
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a (layer) -> b (layer)` for each import of a module of a later layer."""
    return sorted(
        f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
        for a, targets in graph.items()
        for b in targets
        if layer_of(b) > layer_of(a)
    )


def test_every_module_has_a_layer() -> None:
    assert [m for m in modules() if layer_of(m) < 0] == []


def test_no_module_imports_one_of_a_later_layer() -> None:
    assert upward_imports(import_graph()) == []


def test_the_layer_check_finds_an_upward_import() -> None:
    graph = {"imgcls.models.factory": {"imgcls.inference.trained"}, "imgcls.inference.trained": {"imgcls.models"}}
    assert upward_imports(graph) == ["imgcls.models.factory (models) -> imgcls.inference.trained (inference)"]
    assert layer_of("imgcls.export.__main__") > layer_of("imgcls.run.train") > layer_of("imgcls.export.int8")
    # cli's modes name their modules as strings: those count as imports.
    assert {"imgcls.run.train", "imgcls.bench.training", "imgcls.export"} <= import_graph()["imgcls.cli"]


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_layout_lists_every_module() -> None:
    text = LAYOUT.read_text()
    block = text[text.index("## Project layout") :]
    block = block[: block.index("```", block.index("```") + 3)]
    listed: set[str] = set()
    for line in block.splitlines():
        entry = line.strip().split(" ")[0]
        if entry.endswith(".py") and "/" in entry or entry.endswith(".py") and line.startswith("  "):
            listed.add(entry.removesuffix(".py"))
        elif entry.endswith("/") and line.startswith("  "):
            listed.add(entry.rstrip("/"))
    # A package listed as a whole (classify/, bench/) covers its modules.
    actual = {str(p.relative_to(SRC / "imgcls").with_suffix("")) for p in modules().values()}
    uncovered = {
        m for m in actual
        if not m.endswith("__init__") and m not in listed and not any(m.startswith(p + "/") for p in listed)
    }  # fmt: skip
    assert uncovered == set(), f"modules missing from docs/architecture.md's layout: {sorted(uncovered)}"
    stale = {m for m in listed if not (SRC / "imgcls" / f"{m}.py").exists() and not (SRC / "imgcls" / m).is_dir()}
    assert stale == set(), f"docs/architecture.md's layout names modules that do not exist: {sorted(stale)}"
    assert re.search(r"train\.py, evaluate\.py", block)
