"""Mistakes on the command line (imgcls.config.overrides), checked in process on Hydra's real parser and composition:
each is one line naming the override and what was likely meant; the command lines of the docs and tests pass.
tests/test_errors.py runs the commands themselves (exit code 2, one line on stderr, no traceback)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from imgcls.config.checks import EVALUATE, TRAIN
from imgcls.config.overrides import check_command_line
from imgcls.errors import ConfigError

TABLES = {"train": TRAIN, "evaluate": EVALUATE, "classify": None, "export": None}


def refused(command: str, *argv: str) -> str:
    with pytest.raises(ConfigError) as error:
        check_command_line(command, list(argv), TABLES[command])
    line = str(error.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize(
    "command,argv,line",
    [
        # A mistyped key, with or without `+` (was Hydra's 7-line struct error; `+modle=` was accepted silently):
        # the nearest key at the level where it leaves the config, a config group where the value is its choice.
        ("train", ["modle=resnet50"], "modle=resnet50: modle is not a config key; did you mean model=resnet50?"),
        ("train", ["+modle=resnet50"], "+modle=resnet50: modle is not a config key; did you mean model=resnet50?"),
        (
            "train",
            ["trainer.max_epoch=3"],
            "trainer.max_epoch is not a key of trainer; did you mean trainer.max_epochs=3?",
        ),
        ("train", ["+model.archx=x"], "model.archx is not a key of model; did you mean model.arch=x?"),
        ("train", ["trainr.max_epochs=3"], "trainr.max_epochs is not a config key; did you mean trainer.max_epochs=3?"),
        ("train", ["modle.name=x"], "did you mean model.name=x?"),  # model, a mapping, not mode
        ("train", ["+trainer.foo=1"], "trainer.foo is not a key of trainer; the keys of trainer: accelerator, "),
        ("train", ["hydra.run.dirr=out"], "hydra.run.dirr is not a key of hydra.run; did you mean hydra.run.dir=out?"),
        ("evaluate", ["data.rot=/x"], "data.rot is not a key of data; did you mean data.root=/x?"),
        ("classify", ["imgs=[a.jpg]"], "imgs is not a config key; did you mean images=[a.jpg]?"),
        ("export", ["fromat=onnx"], "fromat is not a config key; did you mean format=onnx?"),
        # Keys imgcls sets from others: the key to set instead (was reached only with a `+`, after torch loaded).
        ("train", ["trainer.precision=16"], "trainer.precision is set by imgcls; use precision=amp|bf16|tf32|fp32"),
        ("train", ["+trainer.precision=16"], "trainer.precision is set by imgcls; use precision=amp|bf16|tf32|fp32"),
        ("evaluate", ["trainer.precision=16"], "trainer.precision is set by imgcls; use precision=amp|bf16|tf32|fp32"),
        ("train", ["trainer.accumulate_grad_batches=4"], "set by imgcls; use recipe.global_batch_size"),
        (  # a typo of one of them: that key's way (was the list of trainer's keys)
            "train",
            ["+trainer.precison=16"],
            "+trainer.precison=16: trainer.precison is not a key of trainer; trainer.precision is set by imgcls; "
            "use precision=amp|bf16|tf32|fp32",
        ),
        # Group choices: the nearest one, the allowed ones.
        ("train", ["model=resnet5"], "model=resnet5 is not a known model; did you mean model=resnet50? allowed: "),
        ("train", ["-m", "model=resnet50,resnet5O"], "model=resnet5O is not a known model; did you mean"),
        ("train", ["hydra/launcher=slrum"], "hydra/launcher=slrum is not a known hydra/launcher; did you mean "),
        ("classify", ["precision=amp"], "precision=amp: classify has no config group precision (its groups: model)"),
        ("classify", ["+precision=amp"], "+precision=amp: classify has no config group precision"),
        ("train", ["+model=resnet18"], "model is already a config group of train; choose it without the +: model="),
        # `+` where the key exists, and a key of the check table that this config does not have, without `+`.
        ("train", ["+model.arch=x"], "model.arch is already a key; set it without the +: model.arch=x"),
        # A key inside a value computed as a whole (NVIDIA's published result): the value to set instead (was
        # "not in this config; add it with +", and the `+` then ended in Hydra's three-line refusal).
        (
            "train",
            ["experiment=resnet50_dgx2v_amp_250e", "expected.top1=80"],
            "expected.top1=80: expected is computed as a whole (${imgcls.published:resnet50_dgx2v_amp_250e,expected}:"
            " top1, top1_std, hours, published_on), so a key inside it cannot be set; set expected itself, e.g."
            " expected={top1:80}",
        ),
        ("train", ["experiment=resnet50_dgx2v_amp_250e", "+expected.top1=80"], "e.g. expected={top1:80}"),
        # (a removal passed and did nothing; one beside another mistake ended in an IndexError)
        ("train", ["experiment=resnet50_dgx2v_amp_250e", "~expected.top1"], "cannot be removed; set expected itself"),
        (
            "train",
            ["experiment=resnet50_dgx2v_amp_250e", "~expected.top1", "trainer.max_epoch=3"],
            "cannot be removed; set expected itself, e.g. expected=null",
        ),
        (  # a sweep: the value's place, not an override that does not parse
            "train",
            ["-m", "experiment=resnet50_dgx2v_amp_250e", "expected.top1=79,80"],
            "e.g. expected={top1:VALUE}",
        ),
        # A SLURM sweep sized on the login node, where hardware=auto is still cpu's one device (each job asked for
        # 1 task and 1 GPU).
        (
            "train",
            ["-m", "hydra/launcher=slurm", "model=resnet50,resnet18"],
            "hardware=auto with hydra/launcher=slurm: the launcher sizes each SLURM job here, before auto can see the "
            "compute nodes' GPUs (each job would ask for 1 task and 1 GPU); name their profile: hardware=dgx1v|",
        ),
        # ... whichever job of the sweep has it (only the first job's was checked), and under hydra.mode=MULTIRUN.
        ("train", ["-m", "hydra/launcher=slurm", "hardware=dgxa100,auto"], "hardware=auto with hydra/launcher=slurm"),
        ("train", ["hydra.mode=MULTIRUN", "hydra/launcher=slurm"], "hardware=auto with hydra/launcher=slurm"),
        # Malformed overrides (Hydra's lexer errors), and a bare word: what it likely is.
        ("train", ["model=[a"], "cannot parse the override model=[a (no viable alternative at input '[a')"),
        ("train", ["data.batch_size==3"], "cannot parse the override data.batch_size==3 (extraneous input '=')"),
        ("train", ["resnet50"], "resnet50 is not an override KEY=VALUE; did you mean model=resnet50?"),
        ("train", ["resnt50"], "resnt50 is not an override KEY=VALUE; did you mean model=resnet50?"),
    ],
)
def test_a_mistake_is_one_line_with_what_was_meant(command: str, argv: list[str], line: str) -> None:
    assert line in refused(command, *argv)


def test_inside_a_running_hydra_app() -> None:
    """Composes with the app's config dir instead of initializing Hydra a second time (a ValueError)."""
    from hydra import initialize_config_dir

    from imgcls.config.compose import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        assert "did you mean model=resnet50?" in refused("train", "modle=resnet50")


def test_a_checkpoint_path_without_its_key(tmp_path: Path) -> None:
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"")
    assert refused("evaluate", str(ckpt)).endswith(f"did you mean ckpt={ckpt}?")
    assert refused("train", str(ckpt)).endswith(f"did you mean ckpt_path={ckpt}?")


@pytest.mark.parametrize(
    "command,argv",
    [
        ("train", []),
        ("train", ["experiment=resnet50_dgxa100_amp_90e", "data.root=/x", "hydra.run.dir=/tmp/x"]),
        # Open namespaces and keys of other group options (refused later with their reason) may be added.
        ("train", ["+data.storage_options.endpoint_url=http://127.0.0.1:9000", "run_dir=/tmp/x"]),  # test_shards_s3
        # data.storage_options is an open mapping of the data schema: a key of fsspec's needs no + either
        ("train", ["data.storage_options.anon=true"]),
        ("train", ["model=resnet50", "+model.se_width=16"]),
        ("train", ["+expected.top1=77.0"]),
        ("train", ["experiment=resnet50_dgx2v_amp_250e", "expected={top1:80}"]),
        ("train", ["++model.arch=resnet18"]),
        ("evaluate", ["ckpt=x.ckpt", "+data.storage_options.anon=true", "precision=bf16"]),
        # Sweeps: each choice is checked, the keys on the first job's config.
        ("train", ["-m", "model=resnet50,resnet18", "recipe.lr_per_256=0.1,0.2", "hydra.sweep.dir=/tmp/x"]),
        ("train", ["-m", "model=glob(resnet1*)", "seed=range(1,3)"]),
        ("train", ["hparams_search=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.sampler.n_startup_trials=2"]),
        ("train", ["hydra/launcher=slurm", "hardware=dgxa100", "trainer.num_nodes=2"]),
        ("train", ["-m", "hydra/launcher=slurm", "hardware=dgxa100", "model=resnet50,resnet18"]),
        ("train", ["~experiment", "debug=tiny", "trainer.strategy=ddp_spawn"]),
        ("train", ["--help"]),  # Hydra's own output
        ("classify", ["ckpt=x.onnx", "images=[a.jpg,'b c.jpg']", "json=true", "model=resnet50"]),
        ("export", ["ckpt=x.ckpt", "format=int8", "calibration.images=16"]),
    ],
)
def test_what_the_docs_and_tests_run_passes(command: str, argv: list[str]) -> None:
    check_command_line(command, argv, TABLES[command])


def test_every_documented_command_line_passes() -> None:
    """The train.py / evaluate.py lines of README.md and docs/ (their overrides; paths need not exist)."""
    root = Path(__file__).resolve().parents[1]
    lines = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        text = doc.read_text().replace("\\\n", " ")
        lines += re.findall(r"^\s*(?:\$ )?python (train|evaluate)\.py ([^#`|&;<>$\n]*)", text, re.M)
    assert len(lines) > 20
    for command, args in lines:
        # Their overrides and -m; the placeholders (<DIR>, PATH, ...) and quoted values are left out.
        words = args.split()
        argv = [
            w for w in words if w in ("-m", "--multirun") or "=" in w and not re.search(r"[<>'\"\[]|PATH|\.\.\.", w)
        ]
        try:
            check_command_line(command, argv, TABLES[command])
        except ConfigError as error:
            raise AssertionError(f"python {command}.py {args.strip()}: {error}") from None
