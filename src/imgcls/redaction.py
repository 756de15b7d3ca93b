"""Secrets out of everything imgcls writes or prints: configs, command lines, URLs and log lines.

A storage secret reaches imgcls as a config value (`+data.storage_options.secret=...`), as a URL's userinfo
(`https://user:pw@host/...`) or as a signed URL's query (`?X-Amz-Signature=...`). The run needs the value; no
file, log line, logger or table needs it. Every writer of a config, command line or URL passes it through this
module first, and `install_log_filter` replaces the values themselves in every log record as a last line
(a message that quotes a secret some other way still prints `***`).

Hand-written: neither Hydra nor Lightning redacts (Hydra writes its overrides verbatim; Lightning logs hparams
as given), and fsspec takes credentials as plain keyword arguments.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

REDACTED = "***"

# Config keys whose values are credentials, at any depth (fsspec/s3fs/gcsfs/adlfs option names: key, secret,
# token, password, sas_token, account_key, client_secret, session_token, ...). No other imgcls key matches.
_SECRET_KEY = re.compile(
    r"(^|_)(key|secret|token|password|passwd|pwd|credentials?|auth|authorization|signature|sig|cookie|"
    r"session|private)(_|$)|(access|account|secret|api|private)_?key",
    re.IGNORECASE,
)
# Keys whose name matches the pattern above but hold no credential.
_NOT_SECRET = frozenset({"key_or_group", "sort_key", "monitor_key"})

# scheme://[userinfo@]rest[?query][#fragment], inside any text (a command line, a pipe: command, a log line).
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/@?#'\"]*@)?(?P<rest>[^\s?#'\"]*)"
    r"(?P<query>\?[^\s#'\"]*)?"
)

_known_values: set[str] = set()


def is_secret_key(name: str) -> bool:
    """True for a config key that names a credential (`secret`, `key`, `token`, `account_key`, ...)."""
    name = str(name).lstrip("+~")
    return name not in _NOT_SECRET and bool(_SECRET_KEY.search(name))


def redact_url(text: str) -> str:
    """Every URL in `text` without its userinfo and query: `https://u:p@h/x?sig=1` -> `https://***@h/x?***`."""

    def one(match: re.Match[str]) -> str:
        userinfo = f"{REDACTED}@" if match.group("userinfo") else ""
        query = f"?{REDACTED}" if match.group("query") and len(match.group("query")) > 1 else ""
        return f"{match.group('scheme')}{userinfo}{match.group('rest')}{query}"

    return _URL.sub(one, str(text))


def redact_text(text: str) -> str:
    """A free text (a log line, an error): URLs redacted and every secret value seen so far replaced."""
    text = redact_url(text)
    for value in sorted(_known_values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def redact(value: Any, key: str = "") -> Any:
    """A copy of a config (dicts, lists, scalars; OmegaConf containers are read as plain ones, unresolved)
    with credential values as `***` and URLs without userinfo and query. The input is not changed."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=False)
    if key and is_secret_key(key) and value is not None and not isinstance(value, (Mapping, list, tuple)):
        return REDACTED
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_override(override: str) -> str:
    """One command-line override: `+data.storage_options.secret=abc` -> `+data.storage_options.secret=***`."""
    key, sep, value = str(override).partition("=")
    if sep and any(is_secret_key(part) for part in key.lstrip("+~").split(".")):
        return f"{key}={REDACTED}"
    return redact_text(override)


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    return [redact_override(o) for o in overrides]


def remember_secrets(config: Any) -> None:
    """Note the credential values of a config (and URLs' userinfo and query), so that `redact_text` and the
    log filter replace them wherever they appear."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(config):
        config = OmegaConf.to_container(config, resolve=False)
    _collect(config, "")


def _collect(value: Any, key: str) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _collect(v, str(k))
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, key)
    elif isinstance(value, str):
        if key and is_secret_key(key) and len(value) >= 4 and not value.startswith("${"):
            _known_values.add(value)
        for match in _URL.finditer(value):
            for part in (match.group("userinfo"), match.group("query")):
                if part and len(part) > 4:
                    _known_values.add(part.strip("@?"))
    elif key and is_secret_key(key) and isinstance(value, (int, float)) and len(str(value)) >= 4:
        _known_values.add(str(value))


class RedactingFilter(logging.Filter):
    """Rewrites each record's message with its secrets replaced (attached to handlers, so that records of
    every logger, imgcls's, Lightning's and Hydra's, pass it on their way to the console and log file)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format is logging's to report
            return True
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


_FILTER = RedactingFilter()


def install_log_filter() -> None:
    """The filter on every handler of the root logger and the `imgcls` logger (Hydra's console and file)."""
    for name in ("", "imgcls"):
        for handler in logging.getLogger(name).handlers:
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)


SECRET_ENV_PREFIX = "IMGCLS_SECRET_"


def secrets_to_environment(argv: list[str], env: MutableMapping[str, str] | None = None) -> list[str]:
    """argv with each credential value replaced by `${oc.env:IMGCLS_SECRET_<KEY>}`, the value moved into `env`.

    Hydra writes its overrides verbatim into .hydra/overrides.yaml, hydra.yaml and a sweep's multirun.yaml,
    submitit pickles them, W&B records sys.argv, and Lightning's DDP launcher restarts each rank with sys.argv:
    a value that is never in argv is in none of them. The ranks and cluster jobs inherit the environment
    (SLURM exports it by default), where the interpolation finds it when the config is read. Moved: a
    `KEY=VALUE` whose key names a credential, and a value holding a URL with userinfo or a query string.
    A sweep (`a,b`) or a mapping value is left as written (documented: one key per credential)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    env = os.environ if env is None else env
    parser = OverridesParser.create()
    out = []
    for arg in argv:
        key, sep, raw = arg.partition("=")
        if not sep or arg.startswith("-") or "${" in raw:
            out.append(arg)
            continue
        try:
            override = parser.parse_override(arg)
        except Exception:  # noqa: BLE001 - not an override Hydra reads: Hydra says so itself
            out.append(arg)
            continue
        value = override.value() if not override.is_delete() else None
        if override.is_sweep_override() or not isinstance(value, (str, int, float)) or isinstance(value, bool):
            out.append(arg)
            continue
        path = override.key_or_group
        secret_key = any(is_secret_key(part) for part in path.split("."))
        if not secret_key and redact_url(str(value)) == str(value):
            out.append(arg)
            continue
        name = SECRET_ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", path).upper()
        env[name] = str(value)
        if secret_key:
            _collect(str(value), path.rsplit(".", 1)[-1])
        else:
            _collect(str(value), "")
        out.append(f"{key}=${{oc.env:{name}}}")
    return out
