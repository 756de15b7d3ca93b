"""Bad values, tried as a new user would: one line naming the key, the value and what is allowed; exit 2;
no traceback; nothing trained. And the table behind it (config/checks.py) covers every key."""

from __future__ import annotations

import functools
import logging
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from omegaconf import DictConfig

from imgcls.cli import guarded, run_train
from imgcls.config.checks import EVALUATE, SWITCHES, TRAIN, anything, check_config, leaves, rule_for
from imgcls.config.compose import options
from tests.conftest import ROOT, assert_one_line_error, compose_config
from tests.test_errors import InProcess

# (override, what the one line must say). The first six are the issue's; the rest are their neighbours.
BAD = [
    ("data.batch_size=abc", "data.batch_size=abc must be a positive integer"),
    ("data.shard_cache=null", "data.shard_cache=null must be a folder path"),
    ("recipe.lr_per_256=-1", "recipe.lr_per_256=-1 must be a number > 0"),
    ("data.num_workers=-1", "data.num_workers=-1 must be an integer >= 0"),
    ("recipe.label_smoothing=1.5", "recipe.label_smoothing=1.5 must be a number in [0, 1)"),
    ("recipe.epochs=0", "recipe.epochs=0 must be a positive integer"),
    ("model.image_size=-5", "model.image_size=-5 must be a positive integer"),
    ("data.image_size=0", "data.image_size=0 must be a positive integer"),
    ("recipe.weight_decay=-1", "recipe.weight_decay=-1 must be a number >= 0"),
    ("recipe.weight_decay_on=bn", "recipe.weight_decay_on=bn must be one of conv_and_linear_weights, all_but_norm"),
    ("trainer.max_epochs=-3", "trainer.max_epochs=-3 must be a positive integer (or -1)"),
    ("data.prefetch_factor=0", "data.prefetch_factor=0 must be a positive integer"),
    ("recipe.mixup=-0.2", "recipe.mixup=-0.2 must be a number >= 0"),
    ("data.train_crop_scale=[0.9,0.1]", "data.train_crop_scale=[0.9, 0.1] must be a list of 2 numbers"),
    ("compile=yes", "compile=yes must be true or false"),
    # Every batch would lose a sample to even it for timm's Mixup (module._mix): refused instead.
    ("recipe=250e data.batch_size=7", "data.batch_size=7 must be even with recipe.mixup=0.2"),
    # Lightning's own arguments, refused before anything is built instead of in Lightning's traceback
    ("trainer.devices=abc", "trainer.devices=abc must be a positive number of devices, -1 or auto (every GPU)"),
    ("trainer.devices=0", "trainer.devices=0 must be a positive number of devices"),
    ("trainer.devices=1.5", "trainer.devices=1.5 must be a positive number of devices"),
    ("trainer.devices=null", "trainer.devices=null must be a positive number of devices"),
    ("trainer.devices=-1", "trainer.devices=-1 names GPUs, but trainer.accelerator=cpu runs processes"),
    ("trainer.accelerator=tpu", "trainer.accelerator=tpu must be one of gpu, cuda, cpu, auto"),
    ("trainer.strategy=foo", "trainer.strategy=foo must be one of auto, ddp, ddp_spawn"),
    ("data.backend=dali", "data.backend=dali must be one of torchvision, synthetic, dali_cpu, dali_gpu"),
    # best.ckpt's metric: the ones validation logs, checked before the first epoch rather than after it
    ("callbacks.checkpoint.monitor=val.top2", "callbacks.checkpoint.monitor=val.top2 must be one of val.top1, "),
    ("callbacks.checkpoint.monitor=val_ema.top1", "callbacks.checkpoint.monitor=val_ema.top1 needs the EMA copy"),
    (
        "recipe.label_smoothing=0 callbacks.checkpoint.monitor=val.loss_smoothed",
        "callbacks.checkpoint.monitor=val.loss_smoothed is logged only with label smoothing",
    ),
]


# These run as real `python train.py` processes (the command's own one-line / exit-2 contract, a group choice
# on the command line, a list value, a value the schema's type refuses: the command line's check names it before
# Hydra's merge would fail with a traceback); the others go through the same path in process (imgcls.cli.guarded
# around run_train on the config train.py composes), which saves ~0.5 s of CPU each.
IN_A_PROCESS = ("data.batch_size=abc", "trainer.max_epochs=-3", "data.train_crop_scale=[0.9,0.1]",
                "recipe=250e data.batch_size=7", "data.shard_cache=null", "trainer.devices=abc")  # fmt: skip


def cli(override: str, workdir: Path) -> subprocess.CompletedProcess:
    """`python train.py OVERRIDES` on the default tiny-CPU setting of a new user (the demo experiment)."""
    run_dir = workdir / re.sub(r"[^\w.-]", "_", override)
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "experiment=demo", f"data.root={workdir / 'no-demo-here'}",
         *override.split(), f"hydra.run.dir={run_dir}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def in_process(override: str, workdir: Path, capsys: pytest.CaptureFixture) -> InProcess:
    overrides = ["experiment=demo", f"data.root={workdir / 'no-demo-here'}", *override.split()]
    with pytest.raises(SystemExit) as exit_info:
        guarded(run_train, compose_config(overrides, run_dir=workdir / re.sub(r"[^\w.-]", "_", override)))
    return InProcess(exit_info.value.code, capsys.readouterr().err)


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    """All the CLI runs at once (each is mostly interpreter start-up and imports)."""
    workdir = tmp_path_factory.mktemp("bad-values")
    with ThreadPoolExecutor(max_workers=4) as pool:
        out = dict(zip(IN_A_PROCESS, pool.map(lambda o: cli(o, workdir), IN_A_PROCESS)))
    out["_workdir"] = workdir  # type: ignore[assignment]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("override,message", BAD, ids=[o for o, _ in BAD])
def test_bad_value_is_one_line_and_exit_2(
    cli_results: dict, capsys: pytest.CaptureFixture, override: str, message: str
) -> None:
    workdir = cli_results["_workdir"]
    result = cli_results[override] if override in IN_A_PROCESS else in_process(override, workdir, capsys)
    assert_one_line_error(result, message)
    # Refused before anything was built: the demo dataset was not even written.
    assert not (workdir / "no-demo-here").exists()


def test_in_a_process_names_bad_values() -> None:
    assert set(IN_A_PROCESS) <= {o for o, _ in BAD}


def test_warmup_longer_than_the_run_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="imgcls.config.checks"):
        check_config(compose_config(["experiment=demo", "recipe.epochs=8", "recipe.warmup_epochs=8"]))
    assert [r.getMessage() for r in caplog.records] == [
        "recipe.warmup_epochs=8 is not shorter than the run (recipe.epochs=8): the learning rate is still warming "
        "up when training ends and never reaches its peak or decays"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="imgcls.config.checks"):
        check_config(compose_config(["experiment=demo"]))  # 1 warmup epoch of 5
    assert caplog.records == []


@pytest.mark.parametrize(("monitor", "mode"), [("val.top1", "max"), ("val_ema.top5", "max"), ("val.loss", "min"),
                                                ("val_ema.loss_smoothed", "min")])  # fmt: skip
def test_best_checkpoint_keeps_the_lowest_loss_or_highest_accuracy(monitor: str, mode: str, tmp_path: Path) -> None:
    from imgcls.callbacks.checkpoint import checkpoint_callbacks

    cfg = compose_config(["experiment=demo", f"callbacks.checkpoint.monitor={monitor}"]).callbacks.checkpoint
    (best,) = [c for c in checkpoint_callbacks(cfg, tmp_path) if c.monitor == monitor]
    assert best.mode == mode


@pytest.mark.parametrize(
    ("devices", "world_size"), [("'0,1'", 2), ("'3,'", 1), ("[0,2,5,7]", 4), ("4", 4), ("auto", 1)]
)
def test_every_devices_form_lightning_takes_plans(devices: str, world_size: int) -> None:
    """What config.ranges.lightning_devices admits, the plan counts (a GPU list was int('0,1'): a traceback)."""
    from imgcls.run.plan import resolve_plan

    cfg = compose_config(["experiment=resnet50_dgxa100_amp_90e", f"trainer.devices={devices}"])
    check_config(cfg)
    assert resolve_plan(cfg, check_devices=False).world_size == world_size


def test_training_past_the_schedule_warns(caplog: pytest.LogCaptureFixture) -> None:
    """Epochs past recipe.epochs train at the LR the schedule ended with (0 for cosine): one line says so."""
    with caplog.at_level(logging.WARNING, logger="imgcls.config.checks"):
        check_config(compose_config(["experiment=demo", "trainer.max_epochs=8"]))  # the demo's recipe: 5 epochs
    assert [r.getMessage() for r in caplog.records] == [
        "trainer.max_epochs=8 is longer than the schedule (recipe.epochs=5): the epochs after it train at the "
        "learning rate the schedule ends with; recipe.epochs=8 stretches the schedule instead"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="imgcls.config.checks"):
        check_config(compose_config(["experiment=demo", "trainer.max_epochs=3"]))  # --run-epochs: a part of it
    assert caplog.records == []


def test_tf1_crop_without_object_boxes_warns(caplog: pytest.LogCaptureFixture) -> None:
    """TF1's recipe crops against the records' object boxes: from an image folder (the default format) there are
    none, and the run says so in one line instead of cropping against the whole image unannounced."""
    with caplog.at_level(logging.WARNING, logger="imgcls.config.checks"):
        check_config(compose_config(["experiment=tf1_resnet50_dgx1v_amp_90e"]))
    assert [r.getMessage() for r in caplog.records] == [
        "data.train_crop_object_boxes=true (TF1's crop covers ImageNet's object boxes) with data.format=folder, "
        "which carries no boxes: the crop samples against the whole image, as TF2's; NVIDIA's TF1 runs read the "
        "boxes from TFRecords (data.format=tfrecord)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="imgcls.config.checks"):
        check_config(compose_config(["experiment=tf1_resnet50_dgx1v_amp_90e", "data.format=tfrecord"]))
        check_config(compose_config(["experiment=tf2_efficientnet_b0_8xa100_amp"]))  # TF2: the whole image
    assert caplog.records == []


def test_the_cli_checks_before_importing_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    """imgcls.cli checks the config before it imports the mode's module, which checks it again: the warning is
    logged by the second check only."""
    from imgcls.cli import run_train

    cfg = compose_config(["experiment=demo", "recipe.epochs=8", "recipe.warmup_epochs=8", "mode=plan"])
    with caplog.at_level(logging.WARNING, logger="imgcls.config.checks"):
        run_train(cfg)
    assert [r.getMessage()[:45] for r in caplog.records] == ["recipe.warmup_epochs=8 is not shorter than th"]


# --- the table covers the config --------------------------------------------------------------------------
@functools.cache
def _shipped_configs() -> tuple[DictConfig, ...]:
    # Cached for the process, not the module: pytest sets a module-scoped fixture up again when the module's
    # tests do not run back to back (as under pytest-xdist), and these ~140 compositions take ~50 s.
    configs = [compose_config([])]
    for group in ("model", "precision", "hardware", "recipe", "data", "logger", "callbacks", "trainer", "experiment"):
        configs += [compose_config([f"{group}={option}", *_needs(group, option)]) for option in options(group)]
    return tuple(configs)


@pytest.fixture(scope="module")
def shipped_configs() -> list[DictConfig]:
    """The default config and each option of every group (experiments included) swapped in."""
    return list(_shipped_configs())


def _needs(group: str, option: str) -> list[str]:
    """What an option cannot run without: the QAT recipes fine-tune a trained network (model.weights)."""
    return ["model.weights=/trained.ckpt"] if group == "recipe" and option.startswith("qat") else []


@pytest.fixture(scope="module")
def shipped_leaves(shipped_configs: list[DictConfig]) -> dict[str, set]:
    found: dict[str, set] = {}
    for cfg in shipped_configs:
        for key, value in leaves(cfg):
            found.setdefault(key, set()).add(type(value).__name__)
    return found


@pytest.mark.slow
def test_every_key_of_every_shipped_config_has_a_rule(shipped_leaves: dict[str, set]) -> None:
    """A key added to a config file without a rule fails here, so it cannot slip past the checks."""
    # logger.csv and logger.tensorboard: null (off) in the options that leave them to the schema; their rule is a
    # switch's (SWITCHES), as a config's keys are known (checks.known)
    assert sorted(k for k in shipped_leaves if rule_for(k, {**TRAIN, **SWITCHES}) is None) == []


@pytest.mark.slow
def test_every_numeric_key_is_range_checked(shipped_leaves: dict[str, set]) -> None:
    free = ("expected.", "hardware.devices", "trainer.devices")  # informational / checked by runtime.py
    numeric = [k for k, types in shipped_leaves.items() if types & {"int", "float"}]
    assert len(numeric) > 60
    unchecked = [k for k in numeric if rule_for(k, TRAIN) is anything and not k.startswith(free)]
    assert unchecked == []


@pytest.mark.slow
def test_every_rule_matches_a_shipped_key(shipped_leaves: dict[str, set]) -> None:
    """No stale rules: a renamed key must be renamed in the table too. hardware.auto is written by imgcls when
    hardware=auto resolves (config/hardware.py), never by a YAML file."""
    written_at_run_time = {"hardware.auto"}

    def used(pattern: str) -> bool:  # a block that may be null (logger.wandb) is used where a key below it is set
        return any(rule_for(k, {pattern: anything}) or k.startswith(pattern + ".") for k in shipped_leaves)

    stale = [p for p in TRAIN if not used(p)]
    assert [p for p in stale if p not in written_at_run_time] == []


@pytest.mark.slow
def test_every_shipped_config_passes(shipped_configs: list[DictConfig]) -> None:
    for cfg in shipped_configs:
        check_config(cfg)


# --- evaluate.py -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_evaluate_checks_its_values_too(tmp_path: Path) -> None:
    """Was a RuntimeError traceback ("negative dimension -5") from the inference benchmark."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "evaluate.py"), "mode=benchmark", "model=resnet18", "batch_sizes=[1]",
         "benchmark.image_size=-5", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert_one_line_error(result, "benchmark.image_size=-5 must be a positive integer")


@pytest.mark.slow
def test_every_key_of_the_evaluate_config_has_a_rule() -> None:
    configs = [compose_config([], "evaluate")]
    configs += [compose_config([f"{g}={o}"], "evaluate") for g in ("model", "precision") for o in options(g)]
    missing = set()
    for cfg in configs:
        check_config(cfg, EVALUATE)
        missing |= {k for k, _ in leaves(cfg) if rule_for(k, EVALUATE) is None}
    assert sorted(missing) == []
