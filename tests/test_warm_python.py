"""The warm server (tests/warm_python.py) gives what a fresh `python SCRIPT` gives: argv, cwd, environment, stdout
and stderr, exit codes, signals; and one command's exit does not take away what the next one uses."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

from tests import warm_python

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("WARM_TEST"), "main", __name__)
    print("to stderr", file=sys.stderr)
    if sys.argv[1] == "raise":
        raise ValueError("boom")
    if sys.argv[1] == "sleep":
        open(sys.argv[2], "w").close()
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
    """
)


@pytest.mark.slow
def test_a_command_sees_its_argv_cwd_and_environment_and_exits_with_its_code(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    result = warm_python.run([script, "3"], env={"WARM_TEST": "yes"}, cwd=tmp_path)
    assert result.returncode == 3
    assert result.stdout == f"argv ['3'] cwd {tmp_path} env yes main __main__\n"
    assert result.stderr == "to stderr\n"
    failed = warm_python.run([script, "raise"], base_env={"PATH": "/usr/bin"})
    assert failed.returncode == 1 and "env None" in failed.stdout  # the environment is replaced, not merged
    assert failed.stderr.splitlines()[-1] == "ValueError: boom" and "Traceback" in failed.stderr
    started = tmp_path / "started"
    proc = warm_python.start([script, "sleep", started])
    while not started.exists():
        assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM


@pytest.mark.slow
def test_wandb_media_of_one_command_outlive_another_commands_exit(tmp_path: Path) -> None:
    """wandb.init registers the removal of its media folder at exit; a folder shared with the server would be
    gone for every later command (Lightning's WandbLogger.log_image then fails)."""
    script = tmp_path / "media.py"
    script.write_text(textwrap.dedent(
        """
        import sys
        import numpy as np
        import wandb
        run = wandb.init(mode="offline", dir=sys.argv[1])
        run.log({"image": wandb.Image(np.zeros((8, 8, 3), np.uint8))})
        run.finish()
        """
    ))  # fmt: skip
    for k in range(2):
        result = warm_python.run([script, tmp_path], env={"WANDB_SILENT": "true"})
        assert result.returncode == 0, (k, result.stderr[-2000:])


def test_compositions_shared_through_the_cache_folder_equal_hydras(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """conftest._composed hands the other xdist worker a composition as YAML: what it loads back must be what
    Hydra composes (interpolations kept, values, struct flag)."""
    import copy

    from omegaconf import OmegaConf, open_dict

    import imgcls.config.compose
    from tests import conftest

    monkeypatch.setenv(conftest.COMPOSE_CACHE_VARIABLE, str(tmp_path))
    cases = [("experiment=tf2_efficientnet_b4_8xa100_amp",), ("experiment=resnet50_dgxa100_tf32_90e", "seed=3")]
    for overrides in cases:
        conftest._composed.cache_clear()
        written = conftest._composed(overrides, "train")  # composed by Hydra, then written
        conftest._composed.cache_clear()
        loaded = conftest._composed(overrides, "train")  # read back
        assert loaded is not written and OmegaConf.is_struct(loaded)
        fresh = imgcls.config.compose.compose_config("train", list(overrides))
        for cfg in (loaded, fresh):
            assert OmegaConf.to_container(cfg) == OmegaConf.to_container(fresh)
            resolved = copy.deepcopy(cfg)
            with open_dict(resolved):
                resolved.run_dir = "/r"  # ${hydra:...} outside a Hydra run
            assert (
                OmegaConf.to_container(resolved, resolve=True)["recipe"]
                == OmegaConf.to_container(OmegaConf.merge(fresh, {"run_dir": "/r"}), resolve=True)["recipe"]
            )
    assert len(list(tmp_path.glob("*.yaml"))) == len(cases)
    conftest._composed.cache_clear()
