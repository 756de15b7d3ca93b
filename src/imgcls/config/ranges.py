"""What a config value may be: the checks config/schema.py's fields name as `allowed` (a key's range sits on its
field, beside its type and default), and config/checks.py's tables of the other commands (evaluate, classify,
export) use. A check returns None for an allowed value, else what is allowed in words ("a positive integer"), which
the one-line error of a bad value says: `KEY=VALUE must be <what>`. Free of torch and of the rest of the config
package, so that schema.py and checks.py both import it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from omegaconf import ListConfig

# A check returns None when the value is allowed, else what is allowed ("a positive integer").
Check = Callable[[Any], "str | None"]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def integer(low: int, high: int | None = None, null: bool = False, also: tuple[int, ...] = ()) -> Check:
    if high is not None:
        what = f"an integer from {low} to {high}"
    else:
        what = {0: "an integer >= 0", 1: "a positive integer"}.get(low, f"an integer >= {low}")
    if also:
        what += " (or " + ", ".join(map(str, also)) + ")"
    what += " or null" if null else ""

    def check(v: Any) -> str | None:
        if v is None and null or v in also and _is_int(v):
            return None
        ok = _is_int(v) and v >= low and (high is None or v <= high)
        return None if ok else what

    return check


def number(low: float, high: float | None = None, *, open_low: bool = False, open_high: bool = False,
           null: bool = False) -> Check:  # fmt: skip
    left, right = "(" if open_low else "[", ")" if open_high else "]"
    if high is None:
        what = f"a number {'>' if open_low else '>='} {low:g}"
    else:
        what = f"a number in {left}{low:g}, {high:g}{right}"
    what += " or null" if null else ""

    def check(v: Any) -> str | None:
        if v is None and null:
            return None
        if not _is_number(v):
            return what
        above = v > low if open_low else v >= low
        below = high is None or (v < high if open_high else v <= high)
        return None if above and below else what

    return check


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def choice(*allowed: str) -> Check:
    def check(v: Any) -> str | None:
        return None if v in allowed else "one of " + ", ".join(allowed)

    return check


def lightning_devices(v: Any) -> str | None:
    """trainer.devices / hardware.devices as Lightning takes them: a number of processes, -1 or auto (every GPU),
    or which GPUs (a list of indices, or "0,1")."""
    what = "a positive number of devices, -1 or auto (every GPU), or a list of GPU indices ([0,1] or '0,1')"
    if isinstance(v, bool):
        return what
    if isinstance(v, int):
        return None if v >= 1 or v == -1 else what
    if isinstance(v, str):
        text = v.strip()
        if text in ("auto", "-1"):
            return None
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not parts or not all(part.isdigit() for part in parts):
            return what
        return None if "," in text or int(parts[0]) >= 1 else what
    if isinstance(v, (list, tuple)) or (hasattr(v, "__len__") and hasattr(v, "__iter__")):
        items = list(v)
        ok = items and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items)
        return None if ok and len(set(items)) == len(items) else what
    return what


def or_null(check: Check) -> Check:
    """check, or null (evaluate's keys: null = the checkpoint's value)."""
    what = f"{check(object())} or null"  # a check names what it allows for any value it refuses
    return lambda v: None if v is None or check(v) is None else what


def anything(v: Any) -> str | None:
    """No range here: the value is checked where it is used (a timm arch, a path, a Lightning argument), or it is
    free-form (a name, a note kept in the run's config). A schema field without an `allowed` has this."""
    return None


def folder(v: Any) -> str | None:
    # A folder imgcls writes in: null would become a folder named "None" in the working directory.
    return None if isinstance(v, str) and v.strip() else "a folder path"


def numbers(
    length: int | None, low: float, high: float | None = None, ordered: bool = False, open_low: bool = False
) -> Check:
    """A list of `length` numbers (None: any length) in a range."""
    item = number(low, high, open_low=open_low)
    count = f"{length} " if length is not None else ""
    what = f"a list of {count}numbers, each {str(item(None)).removeprefix('a ')}"  # item(None) is its own text
    what += ", in increasing order" if ordered else ""

    def check(v: Any) -> str | None:
        if not isinstance(v, (list, tuple, ListConfig)) or length is not None and len(v) != length:
            return what
        if any(item(x) for x in v):
            return what
        return None if not ordered or list(v) == sorted(v) else what

    return check


def limit_batches(zero_ok: bool) -> Check:
    """Lightning's limit_*_batches: a count of batches or a fraction of the epoch."""
    if zero_ok:
        what = "a number of batches >= 0, a fraction in [0, 1], or null"
    else:
        what = "a number of batches >= 1, a fraction in (0, 1], or null"

    def check(v: Any) -> str | None:
        if v is None:
            return None
        if _is_int(v):
            return None if v >= (0 if zero_ok else 1) else what
        if _is_number(v) and (0 <= v <= 1 if zero_ok else 0 < v <= 1):
            return None
        return what

    return check


POSITIVE = integer(1)
POSITIVE_OR_NULL = integer(1, null=True)
COUNT = integer(0)
RATE = number(0, 1, open_high=True)  # a probability or fraction that must leave something (dropout, smoothing)
WEIGHT_DECAY = number(0)
STEPS_LIMIT = integer(1, also=(-1,))  # Lightning: -1 = no limit; 0 would "train" nothing and exit 0
SEED = integer(0, 2**32 - 1)  # numpy's and DALI's seed range
TRAIN_CROP = choice("random_resized", "tf")  # recipe.train_crop and data.train_crop (data/tf_crop.py)


def not_barebones(v: Any) -> str | None:
    """trainer.barebones: Lightning refuses barebones with what every imgcls run uses (checkpoints, loggers, the
    progress bar, its log cadence)."""
    return None if v is False else "false (barebones drops the checkpoints and logs)"
