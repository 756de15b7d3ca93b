"""The docs state facts in the present tense; history goes to CHANGELOG.md and commit bodies.

Each rule below matches a diary marker that the docs once carried ("session 11", "Until commit 257aa10 ...",
"Found while testing ..., and fixed", "**Fixed**:", "before this change", "used to say", a dated log entry,
a row of "dali_cpu before 257aa10"). A measurement may still name its date: that is a condition of a figure,
not a story. An imgcls commit is not: a reader cannot run it, so a figure of older code is stated by the
configuration that measured it or left to CHANGELOG.md; only the upstream commits the docs cite as sources
(NVIDIA_COMMITS) may stand. The docs also name only modules, config keys and paths that exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

# Upstream commits the docs cite as sources, by the prefix they are cited with: not this repository's history.
NVIDIA_COMMITS = {
    "729963dd": "DeepLearningExamples, the code every fidelity row is read from",
    "7e96091c": "DeepLearningExamples, whose parent still has the removed 50-epoch scripts",
    "097c7ff9": "DeepLearningExamples, the commit that removed the 50-epoch scripts",
    "f217ab11": "DeepLearningExamples, which dropped the legacy ResNet configs (resnet_configs)",
    "6fcd5f5d": "DeepLearningExamples, the DALI train resize's antialias setting",
    "751469e8": "keras-team/keras, the Keras 2.6 code of NVIDIA's TF2 container",
}

DIARY = {
    "a work session": re.compile(
        r"\bsessions? \d+\b|\b(?:this|that|the previous|a later|an earlier|the next|other) sessions?(?:'s?)?\b", re.I
    ),
    "a commit as an event": re.compile(r"\b(?:until|since) (?:commit )?[0-9a-f]{7,40}\b", re.I),
    "a bug story": re.compile(r"(?i:\bfound while\b|\band fixed\b)|\bFixed\b\**:"),
    "a change as the reference point": re.compile(
        r"\b(?:before|since) this (?:change|fix|work|session|commit)\b|\bafter (?:this|the) fix(?:es)?\b", re.I
    ),
    "what the code used to do": re.compile(
        r"\bused to (?:say|be|set|run|read|take|write|call|stop|die|fail|raise|hang|lose)\b", re.I
    ),
    "a dated entry": re.compile(r"^\s*(?:#+|[-*]|\|)\s*(?:\*\*)?20\d\d-\d\d-\d\d\b"),
    "who was at work": re.compile(r"\bthe lead's\b|\bother (?:engineers|agents|helpers)\b", re.I),
    # The suite's size changes with every test added: `make test` prints it.
    "a count of the suite's tests": re.compile(r"\b\d[\d,]{2,} tests\b"),
    # A hex word of 7-40 characters with a letter (bfdfcff has no digit), not a number's mantissa (6.103515625e-05).
    "an imgcls commit": re.compile(
        rf"(?<![\w.])(?!(?:{'|'.join(NVIDIA_COMMITS)})[0-9a-f]*\b)(?=[0-9a-f]*[a-f])[0-9a-f]{{7,40}}\b"
        r"(?![-+]\d)"
    ),
}


def diary_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, rule, line) for every line of a markdown text that narrates history."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for rule, pattern in DIARY.items():
            if pattern.search(line):
                found.append((number, rule, line.strip()))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_doc_narrates_history(doc: Path) -> None:
    found = diary_lines(doc.read_text(encoding="utf-8"))
    assert not found, "\n".join(f"{doc.name}:{n}: {rule}: {line[:160]}" for n, rule, line in found)


# Lines the docs carried before they were rewritten: each rule must still catch its kind.
OLD_LINES = [
    "| session 11 start (the same commit, idle machine) | 829 | 12 min 48 s |",
    "Run by hand this session, skipped in `make test` for what the machine lacks",
    "| before, last clean-clone CI runs of the previous session (idle machine) | 771 |",
    "Until commit 257aa10 (2026-11-23), `dali_cpu` opened every file before training",
    "- Found while testing the DALI resume, and fixed: at every epoch's start the loader ran out the epoch",
    "biases, and EfficientNet's classifier timm's init. **Fixed**: `init_nvidia` resets SE layers",
    "  DALI also shuffles the first epoch, so a run's order differs from imgcls before this change.",
    '  a rank whose own values were clean used to say "a weight or buffer is not finite"',
    "## 2026-11-22: the hang that kept CI from landing",
    "**Load:** the machine is shared: the lead's QAT fine-tuning ran until 15:18:40",
    "data set, no download): 1686 tests, 21 of them skipped for what the machine lacks (a GPU, hadolint, an NVIDIA",
    "| dali_cpu before 257aa10 (pre-scan; 2026-11-23, load 3-5) | first | 367.1 | 370.5 | 3336 | - |",
    "| imgcls before the loop work of this section (b7c7e10), for comparison | 6.90 |",
    "alternating pairs of runs, each against a `git worktree` of bfdfcff with this overhead.py",
]

# Present-tense lines of the docs that name a date, a commit or a session of another kind.
FACT_LINES = [
    "Measured 2026-11-25, 2 vCPUs, the 1.33M-file tree, DALI 2.4.0, with two other users' jobs running",
    "→ Results (commit 729963dd, 2024-04-04; this repository's copy of the tables:",
    "`729963dd47e7c8bd462ad10bfac7a7b0b604e6dd` (TF1 = `TensorFlow/Classification/ConvNets`,",
    "`git show 7e96091c^:PYT/resnet50v1.5/training/{AMP,FP32}/DGX{1,2}_RN50_*_50E.sh`; deleted in 097c7ff9",
    "| resnext101_32x4d_dgx1v_amp_90e | plan.weight_decay | 6.103515625e-05 | PYT/configs.yml:86 |",
    "(`MALLOC_MMAP_THRESHOLD_=4194304`",
    "Each row is a `train.py` process in its own session (process group); past `--timeout` the",
    "latency = one `session.run` / forward of the whole batch",
    "the image size is used to build the val transform",
    "| `--topk K` | fixed: top-1 and top-5 | |",
]


@pytest.mark.parametrize("line", OLD_LINES)
def test_the_rules_catch_a_diary_line(line: str) -> None:
    assert diary_lines(line)


@pytest.mark.parametrize("line", FACT_LINES)
def test_the_rules_leave_a_stated_fact(line: str) -> None:
    assert not diary_lines(line)


# A repository path as docs, config comments and docstrings write it: src/imgcls/..., imgcls/... (short for
# src/imgcls/...), conf/..., docs/..., tests/..., docker/....
REPO_PATH = re.compile(
    r"(?<![\w./$-])((?:src/)?imgcls/[\w/]+\.(?:py|csv|yaml)|(?:conf|docs|tests|docker|src)/[\w/.-]*\w)"
)


def stale_paths(text: str, tracked: list[str]) -> list[str]:
    """The paths named in `text` that no tracked file is, or starts with (`conf/model/efficientnet_b0` stands
    for its variants), skipping placeholders (`conf/GROUP/_base.yaml`) and the user's own conf/local/."""
    stale = []
    for match in REPO_PATH.finditer(text):
        path = match.group(1)
        path = f"src/{path}" if path.startswith("imgcls/") else path
        if re.search(r"/[A-Z_]*[A-Z][A-Z_]*(?:/|\.|$)", path) or path.startswith("conf/local"):
            continue
        if not any(name == path or name.startswith(path) for name in tracked):
            stale.append(match.group(1))
    return stale


def _tracked() -> list[str]:
    """The repository's files: git's list in a checkout, the tree's own files in an exported copy."""
    import subprocess

    if (ROOT / ".git").exists():
        return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    skip = (".venv", ".git", "outputs", "multirun")
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and p.parts[len(ROOT.parts)] not in skip]


def test_every_path_the_docs_configs_and_code_name_exists() -> None:
    """A file that moved leaves no reader at its old path (published_runs.csv moved into config/ while 100
    comments still named src/imgcls/published_runs.csv). CHANGELOG.md is history and keeps old paths."""
    tracked = _tracked()
    assert "src/imgcls/config/published_runs.csv" in tracked
    history = ("CHANGELOG.md", "tests/test_docs.py")  # the changelog and this file's own examples
    texts = [name for name in tracked if name.endswith((".md", ".yaml", ".py", ".toml")) and name not in history]
    found = {
        name: stale for name in texts if (stale := stale_paths((ROOT / name).read_text(encoding="utf-8"), tracked))
    }
    assert not found, found


def test_a_moved_file_is_a_stale_path() -> None:
    tracked = ["src/imgcls/config/published_runs.csv", "conf/model/efficientnet_b0.yaml"]
    assert stale_paths("rows of src/imgcls/published_runs.csv; imgcls/published_runs.csv", tracked) == [
        "src/imgcls/published_runs.csv", "imgcls/published_runs.csv"
    ]  # fmt: skip
    assert (
        stale_paths("imgcls/config/published_runs.csv, conf/model/efficientnet_b0*, conf/GROUP/x.yaml", tracked) == []
    )


# A module as the docs name it: imgcls.bench.overhead, imgcls.callbacks.order.training_callbacks (a module's name).
MODULE = re.compile(r"(?<![\w./-])imgcls(?:\.\w+)+")
SRC = ROOT / "src"


def _top_level_names(module: Path) -> set[str]:
    """What `import` would find on a module without running it: its defs, classes, assignments and imports."""
    import ast

    names: set[str] = set()
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def module_exists(dotted: str, src: Path = SRC) -> bool:
    """A package, a module, or a name defined at a module's (or package's) top level, read from the file tree
    under src/ (importing the heavy modules, torch's and DALI's, to check a name would slow the suite)."""
    path, parts = src, dotted.split(".")
    for i, part in enumerate(parts):
        if (path / part).is_dir():
            path = path / part
        elif (path / f"{part}.py").is_file():
            return i + 1 == len(parts) or parts[i + 1] in _top_level_names(path / f"{part}.py")
        else:
            init = path / "__init__.py"
            return init.is_file() and part in _top_level_names(init)
    return True


def _resolvers() -> set[str]:
    """The OmegaConf resolvers imgcls registers (`${imgcls.published:...}`): names, not modules."""
    text = (SRC / "imgcls/config/compose.py").read_text(encoding="utf-8")
    return set(re.findall(r"register_new_resolver\(\s*\"(imgcls\.\w+)\"", text))


def stale_modules(text: str, src: Path = SRC, resolvers: frozenset[str] = frozenset()) -> list[str]:
    """The imgcls.* names in `text` that are no module or top-level name, skipping placeholders
    (`imgcls.x:run`, `imgcls.bench.X`: a last part of one letter) and the resolvers."""
    stale = []
    for match in MODULE.finditer(text):
        name = match.group(0)
        if name in resolvers or len(name.rsplit(".", 1)[1]) == 1:
            continue
        if not module_exists(name, src):
            stale.append(name)
    return stale


def test_every_module_the_docs_name_exists() -> None:
    """`imgcls.seeding.RankSeed` after RankSeed moved to imgcls.callbacks.seeding sends a reader nowhere."""
    resolvers = frozenset(_resolvers())
    assert "imgcls.published" in resolvers
    found = {
        doc.name: stale for doc in DOCS if (stale := stale_modules(doc.read_text(encoding="utf-8"), SRC, resolvers))
    }
    assert not found, found


def test_a_moved_module_is_a_stale_name() -> None:
    text = (
        "`python -m imgcls.bench.overhead`, imgcls.callbacks.order.training_callbacks, imgcls.config.checks.SCHEMAS, "
        "imgcls.data.shards (a package), `imgcls.seeding.RankSeed`, imgcls.bench.overheads, imgcls.run.train.runn, "
        "`imgcls.x:run`, ${imgcls.published:resnet50}"
    )
    assert stale_modules(text, SRC, frozenset(_resolvers())) == [
        "imgcls.seeding.RankSeed", "imgcls.bench.overheads", "imgcls.run.train.runn"
    ]  # fmt: skip


# A config key as the docs write it in code: `recipe.ema_decay`, `data.backend=dali_cpu`, `precision.loss_scale.*`;
# in an inline span or a fenced block (a command line). A file name (`data.py`, `calibration.py`) is not a key.
GROUPS = ("model", "recipe", "data", "precision", "hardware", "logger", "callbacks", "trainer", "benchmark",
          "calibration", "expected")  # fmt: skip
KEY = re.compile(rf"(?<![\w.$/-])(?:{'|'.join(GROUPS)})(?:\.[\w*]+)+")
FILE_SUFFIX = re.compile(r"\.(?:py|yaml|md|json|csv|txt|log|sh)$")
# Keys the docs name on purpose that no table holds, each with its reason.
NOT_KEYS = {
    "trainer.fit": "Lightning's Trainer.fit, a method: where a clock stops, not a setting",
}


def _flat_keys(tree: object, prefix: str = "") -> dict[str, None]:
    """The dotted keys of a YAML file's mappings, leaves and the mappings above them."""
    if not isinstance(tree, dict):
        return {}
    keys: dict[str, None] = {}
    for name, value in tree.items():
        keys[prefix + str(name)] = None
        keys.update(_flat_keys(value, f"{prefix}{name}."))
    return keys


def _key_tables() -> list[dict]:
    """Every key a command's config may hold: check_config's tables, the keys of every shipped option of the
    config groups (conf/GROUP/*.yaml, which tests/test_config_checks.py keeps inside the tables) and the other
    commands' entry configs (classify, export)."""
    import yaml

    from imgcls.config import checks

    conf = SRC / "imgcls/conf"
    entries = [_flat_keys(yaml.safe_load((conf / f"{name}.yaml").read_text())) for name in ("classify", "export")]
    options = [
        _flat_keys(yaml.safe_load(option.read_text()) or {}, f"{group}.")
        for group in GROUPS
        for option in sorted((conf / group).glob("*.yaml"))
    ]
    return [checks._key_table(checks.TRAIN), checks.SET_BY_IMGCLS, checks.EVALUATE, *entries, *options]


def stale_keys(text: str, tables: list[dict]) -> list[str]:
    """The config keys named in `text`'s code that no table knows (a key, a mapping above keys, or a `*` pattern
    matching some key), less NOT_KEYS."""
    import fnmatch

    from imgcls.config import checks

    def known(key: str) -> bool:
        if "*" in key:
            return any(fnmatch.fnmatchcase(k, key) for table in tables for k in table)
        return any(checks.known(key, table) for table in tables)

    stale, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        for code in [line] if fenced else re.findall(r"`([^`\n]+)`", line):
            for match in KEY.finditer(code):
                key = match.group(0)
                if not FILE_SUFFIX.search(key) and key not in NOT_KEYS and not known(key):
                    stale.append(key)
    return stale


def test_every_config_key_the_docs_name_exists() -> None:
    """A renamed or removed key left in a doc is a setting a reader types and gets refused (or, in a YAML file,
    a typo). docs/config-keys.md is generated from the tables themselves."""
    tables = _key_tables()
    docs = [doc for doc in DOCS if doc.name != "config-keys.md"]
    found = {doc.name: stale for doc in docs if (stale := stale_keys(doc.read_text(encoding="utf-8"), tables))}
    assert not found, found


def test_a_removed_key_is_a_stale_name() -> None:
    text = (
        "`recipe.ema_decay=0.9999` and `precision.loss_scale.init_scale`, `data.dali_*`, `calibration.images=64`;\n"
        "`recipe.ema_dacay`, `calibration.imgs`, `data.nope_*`, `trainer.fit`, `data.py`, hydra.run.dir\n"
        "```bash\npython train.py recipe.lr_per_256=0.1 data.bach_size=64 trainer.devices=1\n```\n"
        "data.bach_size outside code is prose\n"
    )
    assert stale_keys(text, _key_tables()) == ["recipe.ema_dacay", "calibration.imgs", "data.nope_*", "data.bach_size"]
