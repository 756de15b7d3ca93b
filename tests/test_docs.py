"""The docs state facts in the present tense; history goes to CHANGELOG.md and commit bodies.

Each rule below matches a diary marker that the docs once carried ("session 11", "Until commit 257aa10 ...",
"Found while testing ..., and fixed", "**Fixed**:", "before this change", "used to say", a dated log entry).
A measurement may still name its date and a comparison row its commit ("before 257aa10"): those are
conditions of a figure, not a story, so the rules leave them alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

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
]

# Present-tense lines of the docs that name a date, a commit or a session of another kind.
FACT_LINES = [
    "Measured 2026-11-25, 2 vCPUs, the 1.33M-file tree, DALI 2.4.0, with two other users' jobs running",
    "| dali_cpu before 257aa10 (pre-scan; 2026-11-23, load 3-5) | first | 367.1 | 370.5 | 3336 | - |",
    "→ Results (commit 729963dd, 2024-04-04; this repository's copy of the tables:",
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
