"""Hydra's own files without secrets: .hydra/{config,hydra,overrides}.yaml and a sweep's multirun.yaml.

Hydra writes them before the task function runs, verbatim, and has no hook to change what it writes; this Hydra
callback rewrites them (redacted, atomically) at the start of each job, before a line of the run is logged, and
puts the log filter on the handlers Hydra has just configured (imgcls.redaction). A value typed on the command
line never reaches these files (cli.py moves it into the environment first); this covers a credential written in
the user's own YAML.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from imgcls.redaction import (
    install_log_filter,
    is_secret_key,
    redact,
    redact_overrides,
    redact_url,
    remember_secrets,
)
from imgcls.storage import write_atomic

HYDRA_FILES = ("config.yaml", "hydra.yaml")


class RedactSecrets(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """submitit pickles the whole config into the sweep folder for its jobs: a credential written in the
        config would be copied there, readable by whoever reads that folder. Refused before anything is launched;
        the environment (which SLURM passes to the job) carries it instead."""
        if "submitit" not in str(OmegaConf.select(config, "hydra.launcher._target_") or ""):
            return
        plain = OmegaConf.to_container(config, resolve=False)
        assert isinstance(plain, dict)
        plain.pop("hydra", None)
        found = _literal_secret(plain, "")
        if found is not None:
            print(
                f"imgcls: error: {found} holds a credential that submitit would write into the sweep folder's job "
                "files; pass it by environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE) or on the "
                f"command line ({found}=..., moved into the environment), not in a YAML file",
                file=sys.stderr,
            )
            sys.exit(2)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            remember_secrets(OmegaConf.to_container(config, resolve=True))
        except Exception:  # noqa: BLE001 - a value that does not resolve is the run's to report, with its key
            remember_secrets(config)
        install_log_filter()
        subdir = OmegaConf.select(config, "hydra.output_subdir")
        if subdir is not None:
            folder = Path(str(config.hydra.runtime.output_dir)) / str(subdir)
            for name in HYDRA_FILES:
                _rewrite(folder / name, redact)
            _rewrite(folder / "overrides.yaml", redact_overrides)
        if OmegaConf.select(config, "hydra.mode") == RunMode.MULTIRUN:
            _rewrite(Path(str(config.hydra.sweep.dir)) / "multirun.yaml", redact)


def _rewrite(path: Path, clean: Any) -> None:
    if not path.is_file():
        return
    original = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    cleaned = clean(original)
    if cleaned != original:
        write_atomic(path, lambda tmp: OmegaConf.save(OmegaConf.create(cleaned), tmp))


def _literal_secret(value: Any, path: str) -> str | None:
    """The key of the first credential written as a value (not an `${oc.env:...}` interpolation)."""
    if isinstance(value, dict):
        for key, item in value.items():
            found = _literal_secret(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        return next((f for i, v in enumerate(value) if (f := _literal_secret(v, f"{path}[{i}]")) is not None), None)
    if isinstance(value, str) and "${" not in value:
        if is_secret_key(path.rsplit(".", 1)[-1]) or redact_url(value) != value:
            return path
    elif value is not None and not isinstance(value, (bool, str)) and is_secret_key(path.rsplit(".", 1)[-1]):
        return path
    return None
