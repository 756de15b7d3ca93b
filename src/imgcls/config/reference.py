"""docs/config-keys.md, generated from the schema: every key of each group's dataclass in config/schema.py with
its type, its default (as the default option's YAML file writes it, else the field's), what it allows, what it
means and its source (the field's metadata). The hardware batch table's rows and evaluate.py's keys, which have no
dataclass, come from config.checks' tables and the comments in conf/. Nothing here is typed a second time;
`python -m imgcls.config.reference` rewrites the file, and tests/test_config_home.py fails while the file differs
from what this module makes.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import MISSING, Field, dataclass, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import MISSING as REQUIRED

from imgcls.config import schema
from imgcls.config.checks import EVALUATE, SCHEMAS
from imgcls.config.ranges import Check, anything

CONF = Path(__file__).resolve().parents[1] / "conf"
OUTPUT = Path("docs") / "config-keys.md"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$")
_MORE = re.compile(r"^ +#\s?(?P<comment>.*)$")  # an indented comment line continues the key above it


@dataclass
class Entry:
    """One key as a YAML file writes it."""

    value: str
    comment: str


def read_yaml_keys(path: Path) -> dict[str, Entry]:
    """Dotted key -> its value text and comment (continued on the indented comment lines below it)."""
    keys: dict[str, Entry] = {}
    stack: list[tuple[int, str]] = []
    last: Entry | None = None
    for line in path.read_text().splitlines():
        more = _MORE.match(line)
        if more and last is not None:
            last.comment = f"{last.comment} {more['comment'].strip()}".strip()
            continue
        match = _KEY.match(line)
        if match is None or match["key"] == "defaults":
            last = None
            continue
        indent = len(match["indent"])
        stack = [(i, k) for i, k in stack if i < indent]
        dotted = ".".join([k for _, k in stack] + [match["key"]])
        last = keys[dotted] = Entry(match["value"].strip(), (match["comment"] or "").strip())
        stack.append((indent, match["key"]))
    return keys


def _defaults_list(path: Path) -> list[str]:
    """The `- name` / `- group: option` entries of a YAML file's defaults list."""
    entries, inside = [], False
    for line in path.read_text().splitlines():
        if line.startswith("defaults:"):
            inside = True
        elif inside and line.startswith("  - "):
            entries.append(line[4:].split("#")[0].strip())
        elif inside and line.strip() and not line.startswith(" "):
            break
    return entries


def _chain(group: str, option: str) -> list[Path]:
    """The files an option composes from, parents first (`defaults: [_base, _self_]`)."""
    path = CONF / group / f"{option}.yaml"
    parents = [e for e in _defaults_list(path) if e not in ("_self_", "_schema") and ":" not in e]
    return [p for parent in parents for p in _chain(group, parent)] + [path]


def default_options(config: str = "train") -> dict[str, str]:
    """Group -> the option CONFIG's defaults list chooses (groups it leaves null are left out)."""
    chosen = {}
    for entry in _defaults_list(CONF / f"{config}.yaml"):
        group, _, option = entry.partition(":")
        option = option.strip()
        if option and option != "null" and not group.startswith("optional"):
            chosen[group.strip()] = option
    return chosen


def _extends_schema(group: str, option: str) -> bool:
    return any("_schema" in _defaults_list(path) for path in _chain(group, option))


def _shown(value: object) -> str:
    """A default as YAML writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def schema_entries(group: str) -> dict[str, Entry]:
    """The group's schema (config/schema.py): every key with a default, as a YAML line would write it, and its
    meaning."""
    entries = {}
    for key, f in schema.keys(schema.GROUPS[group]).items():
        if f.default is not MISSING and f.default != REQUIRED and not is_dataclass(f.default):
            entries[key] = Entry(_shown(f.default), f.metadata.get("meaning", ""))
        elif f.default_factory is not MISSING and not is_dataclass(f.default_factory):
            entries[key] = Entry(_shown(f.default_factory()), f.metadata.get("meaning", ""))
    return entries


def _group_entries(group: str, option: str | None) -> tuple[dict[str, Entry], dict[str, Entry]]:
    """(the keys the default option's files write, later files winning, over its schema's defaults where it extends
    it; the keys of every file of the group)."""
    chain: dict[str, Entry] = schema_entries(group) if option and _extends_schema(group, option) else {}
    for path in _chain(group, option) if option else []:
        for key, entry in read_yaml_keys(path).items():
            old = chain.get(key)
            chain[key] = Entry(entry.value, entry.comment or (old.comment if old else ""))
    every: dict[str, Entry] = dict(chain)
    for path in sorted((CONF / group).glob("*.yaml"), key=lambda p: (not p.stem.startswith("_"), p.stem)):
        for key, entry in read_yaml_keys(path).items():
            if key not in every or not every[key].comment:
                every[key] = entry
    return chain, every


def _allowed(check: Check) -> str:
    """What the rule allows, in its own words (a rule names what it allows for any value it refuses)."""
    if check is anything:
        return "checked where it is used"
    return check(object()) or "anything"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type(f: Field[Any]) -> str:
    """A field's type as the YAML value: a nested dataclass is a mapping, Any is any."""
    kinds = [t.strip() for t in str(f.type).split("|")]
    return " \\| ".join("mapping" if t.endswith("Schema") else "any" if t == "Any" else t for t in kinds)


def _rows(table: dict[str, Check], prefix: str, chain: dict[str, Entry], every: dict[str, Entry],
          fields: dict[str, Field[Any]]) -> list[str]:  # fmt: skip
    """A table row per key: key, type, default (chain: the default option's files), allowed, meaning, source (the
    schema's field, where the key has one; a `*` row's meaning is its comment in conf/)."""
    rows = []
    for pattern, check in table.items():
        local = pattern.removeprefix(prefix)
        found = [k for k in every if fnmatch.fnmatch(k, local)] if "*" in local else [local] * (local in every)
        if local in chain:
            shown = f"`{chain[local].value}`" if chain[local].value else "(a mapping)"
        else:
            shown = "per option" if "*" in local else "— (some options)"
        f = fields.get(local)
        if f is not None:
            kind, meaning, source = _type(f), f.metadata["meaning"], f.metadata["source"]
        else:  # The default option's comment; a key it does not write: the first comment of another option's.
            entries = [chain[local]] if local in chain else [every[k] for k in found]
            kind, meaning, source = "", next((e.comment for e in entries if e.comment), ""), ""
        cells = [f"`{pattern}`", kind, _cell(shown), _cell(_allowed(check)), _cell(meaning), _cell(source)]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def reference() -> str:
    """The text of docs/config-keys.md."""
    chosen = default_options("train")
    lines = [
        "# Config keys",
        "",
        "Generated by `python -m imgcls.config.reference` from `src/imgcls/config/schema.py` (each group's keys with",
        "their type, default, what they allow, meaning and source), `conf/` (the options' values) and, for the",
        "batch table's rows and evaluate.py's keys, `src/imgcls/config/checks.py`; tests/test_config_home.py fails",
        "while this file differs. Edit those, not this file.",
        "Default: the value as the option `python train.py` chooses writes it, else its schema's (" +
        ", ".join(f"{g}={o}" for g, o in chosen.items() if g in SCHEMAS) + "); `*` = one name part, e.g. a batch-table",
        "row; \"— (some options)\": a key only some options of the group set.",
    ]  # fmt: skip
    top = read_yaml_keys(CONF / "train.yaml")
    for group in SCHEMAS:  # train.yaml's order; "" is its own keys
        chain, every = _group_entries(group, chosen.get(group)) if group else (top, top)
        title = f"## {group}" + (f" (default: {chosen[group]})" if group in chosen else "") if group else "## top level"
        lines += ["", title, "", "| key | type | default | allowed | meaning | source |", "|---|---|---|---|---|---|"]
        fields = schema.keys(schema.GROUPS[group])
        lines += _rows(SCHEMAS[group], f"{group}." if group else "", chain, every, fields)
    evaluate = read_yaml_keys(CONF / "evaluate.yaml")
    own = {k: v for k, v in EVALUATE.items() if not k.startswith(("model.", "precision."))}
    lines += ["", "## evaluate.py (model and precision: as above)", ""]
    lines += ["| key | type | default | allowed | meaning | source |", "|---|---|---|---|---|---|"]
    lines += _rows(own, "", evaluate, evaluate, {})
    return "\n".join(lines) + "\n"


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT
    target.write_text(reference())
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
