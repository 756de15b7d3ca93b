"""NVIDIA's published runs: src/imgcls/config/published_runs.csv is the one place their numbers are typed in.

The table is checked number for number against the verbatim copies of NVIDIA's READMEs in docs/reference/
(PyTorch accuracy and time, PyTorch training img/s and time, TF1/TF2 accuracy and time), every experiment
composes to its row, and no experiment file, config or module types in a number the table holds.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from imgcls.config.compose import CONF_DIR, options
from imgcls.config.published import TABLE, expected, resolve, run_of, runs, throughput_table
from imgcls.errors import ConfigError
from imgcls.run.plan import resolve_plan
from tests.conftest import ROOT, compose_config
from tests.test_tf_experiments import PUBLISHED, PUBLISHED_SHAPES

REFERENCE = ROOT / "docs" / "reference"
EXPERIMENTS = [e for e in options("experiment") if e != "demo"]
MACHINES = {"DGX A100 (8x A100 80GB)": "dgxa100", "A100 (8x A100 80GB)": "dgxa100",
            "DGX-1 16GB (8x V100 16GB)": "dgx1v", "DGX-1 (8x V100 16GB)": "dgx1v",
            "DGX-1 32GB (8x V100 32GB)": "dgx1v_32g", "DGX-1 (8x V100 32GB)": "dgx1v_32g",
            "DGX-2 (16x V100 32GB)": "dgx2v"}  # fmt: skip
RESNETS = {"A.2": "resnet50", "A.3": "resnext101_32x4d", "A.4": "se_resnext101_32x4d"}


def _cells(line: str) -> list[str]:
    return [c.strip().strip("*").strip() for c in line.strip().strip("|").split("|")]


def _tables(path: Path, kind: str, mark: str):
    """(section, machine, cells) of every table row holding `mark` under '**Training <kind>: NVIDIA <machine>**'."""
    section = machine = None
    for line in path.read_text().splitlines():
        if heading := re.match(r"### (A\.\d)", line):
            section, machine = heading.group(1), None
        elif title := re.match(rf"\*\*Training {kind}: NVIDIA (.*)\*\*", line):
            machine = MACHINES[title.group(1).strip()]
        elif machine and line.startswith("|") and mark in line:
            yield section, machine, _cells(line)


def _performance() -> tuple[dict, dict]:
    """nvidia-training-performance.md: {(model, hardware, precision): {GPUs: img/s}} and the ResNets'
    {(model, hardware, precision, GPUs): hours of 90 epochs}."""
    img_s: dict[tuple[str, str, str], dict[int, int]] = {}
    hours: dict[tuple[str, str, str, int], int] = {}
    for section, machine, cells in _tables(REFERENCE / "nvidia-training-performance.md", "performance", "img/s"):
        model = RESNETS.get(section)
        if model is None:  # EfficientNet's tables name the model in a first column
            model, cells = cells[0].replace("-", "_"), cells[1:]
        first = "tf32" if machine == "dgxa100" else "fp32"
        for precision, cell in ((first, cells[1]), ("amp", cells[2])):
            img_s.setdefault((model, machine, precision), {})[int(cells[0])] = int(cell.split()[0])
        if section in RESNETS:  # "Mixed Precision Training Time (90E)", then TF32's / FP32's
            for precision, cell in (("amp", cells[6]), (first, cells[7])):
                hours[(model, machine, precision, int(cells[0]))] = int(re.search(r"\d+", cell).group(0))
    return img_s, hours


def _accuracy() -> dict[tuple[str, str, str, int], tuple[int, float, float, int | None]]:
    """nvidia-pytorch-accuracy.md: {(model, hardware, precision, epochs): (GPUs, top-1, spread, hours)}."""
    found = {}
    gpus = {"dgxa100": 8, "dgx1v": 8, "dgx2v": 16}  # the ResNet tables' machines, all their GPUs
    for section, machine, cells in _tables(REFERENCE / "nvidia-pytorch-accuracy.md", "accuracy", "+/-"):
        first = "tf32" if machine == "dgxa100" else "fp32"
        if section in RESNETS:  # Epochs | Mixed Precision Top1 | TF32/FP32 Top1
            for precision, cell in (("amp", cells[1]), (first, cells[2])):
                top1, std = (float(x) for x in cell.split("+/-"))
                found[(RESNETS[section], machine, precision, int(cells[0]))] = (gpus[machine], top1, std, None)
        else:  # Model | Epochs | GPUs | Top1 TF32/FP32 | Top1 AMP | Time TF32/FP32 | Time AMP | speedup
            model = cells[0].replace("-", "_")
            for precision, top, time in ((first, cells[3], cells[5]), ("amp", cells[4], cells[6])):
                top1, std = (float(x) for x in top.split("+/-"))
                found[(model, machine, precision, int(cells[1]))] = (int(cells[2]), top1, std, int(time))
    return found


def test_pytorch_throughput_and_time_are_nvidias() -> None:
    img_s, hours = _performance()
    assert throughput_table() == img_s and len(img_s) == 42
    table = {(r.model, r.hardware, r.precision, r.gpus): r.hours for r in runs() if r.img_s and r.epochs == 90}
    assert table == hours  # the ResNet rows' time is "Training Time (90E)"


def test_pytorch_accuracy_and_time_are_nvidias() -> None:
    table = {
        (r.model, r.hardware, r.precision, r.epochs): (r.gpus, r.top1, r.top1_std, r.hours if r.epochs == 400 else None)
        for r in runs()
        if r.framework == "pytorch" and r.top1 is not None and r.precision != "qat"
    }
    assert table == _accuracy() and len(table) == 42


def _qat_accuracy() -> dict[str, tuple[int, float]]:
    """nvidia-pytorch-accuracy.md's "Quant Inference accuracy" table: {model: (QAT epochs, QAT top-1)}."""
    text = (REFERENCE / "nvidia-pytorch-accuracy.md").read_text()
    rows = re.findall(r"^\|\s*efficientnet-quant-(b\d)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|", text, re.M)
    return {f"efficientnet_{b}": (int(epochs), float(top1)) for b, epochs, top1 in rows}


def test_qat_results_are_nvidias_and_name_their_recipe() -> None:
    """NVIDIA's QAT top-1s (PYT/efficientnet/README.md:831-832) are rows of the table, each of a recipe=qat_<model>
    that fine-tunes as NVIDIA's quant script, on the 8 GPUs of the DGX-1 32GB those scripts ran on."""
    qat = {r.model: r for r in runs() if r.precision == "qat"}
    assert {model: (r.epochs, r.top1) for model, r in qat.items()} == _qat_accuracy()
    assert len(qat) == 2
    for model, run in qat.items():
        assert (run.framework, run.hardware, run.gpus, run.experiment) == ("pytorch", "dgx1v_32g", 8, None)
        recipe = compose_config([f"recipe=qat_{model}"]).recipe
        assert recipe.epochs == run.epochs, model


def test_tf_accuracy_time_batch_and_gpus_are_nvidias() -> None:
    tf = {r.experiment: r for r in runs() if r.framework != "pytorch"}
    assert {name: (r.top1, r.hours) for name, r in tf.items() if (r.top1, r.hours) != (None, None)} == PUBLISHED
    for name, shape in PUBLISHED_SHAPES.items():  # TF1's tables name the per-GPU batch and the GPUs
        assert {"per_device_batch": tf[name].batch, "world_size": tf[name].gpus} | shape == {
            "per_device_batch": tf[name].batch, "world_size": tf[name].gpus}  # fmt: skip
    assert all(r.top1_std is None for r in tf.values())  # TF READMEs publish one run


def test_every_row_names_its_source_lines() -> None:
    keys = [(r.framework, r.model, r.hardware, r.precision, r.gpus, r.epochs) for r in runs()]
    assert len(keys) == len(set(keys))
    for run in runs():
        for ref in run.source.split():
            assert re.fullmatch(r"(PyTorch|TensorFlow2?)/Classification/ConvNets/\S+(@\w+\^)?:\d+(,\d+)*", ref), run


def test_every_experiment_has_one_row_and_every_row_an_experiment_file() -> None:
    named = [r.experiment for r in runs() if r.experiment]
    assert sorted(named) == sorted(set(named)) == EXPERIMENTS


def test_an_experiment_file_keeps_only_what_is_its_own() -> None:
    """Its `expected` is its row (by its own name), its TF per-GPU batch too; no number of the table in it."""
    for name in EXPERIMENTS:
        text = (CONF_DIR / "experiment" / f"{name}.yaml").read_text()
        assert re.search(rf"^expected: \${{imgcls\.published:{name},expected}}(  #.*)?$", text, re.M), name
        assert not re.search(r"^\s+(top1|top1_std|hours|published_on|gpus):", text, re.M), name
        for value in re.findall(r"^\s+batch_size: (.*?)\s*(?:#.*)?$", text, re.M):
            assert value == f"${{imgcls.published:{name},batch}}", (name, value)
        assert (run_of(name).batch is None) == ("batch_size:" not in text) or "\n  - tf1_" in text, name


def _nvidia_numbers() -> set[float]:
    """The table's numbers no config or module has another reason to hold: top-1s (two decimals) and img/s
    above 100 that are not multiples of 8 (batch and image sizes are: B5's 456 px is also a ResNeXt's img/s)."""
    top1 = {r.top1 for r in runs() if r.top1 is not None}
    img_s = {r.img_s for r in runs() if r.img_s is not None and r.img_s % 8 and r.img_s > 100}
    return top1 | img_s


def _yaml_numbers(node, where: str):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _yaml_numbers(value, f"{where}.{key}")
    elif isinstance(node, list):
        for k, value in enumerate(node):
            yield from _yaml_numbers(value, f"{where}[{k}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield node, where


def test_no_config_or_module_types_in_a_published_number() -> None:
    numbers = _nvidia_numbers()
    assert len(numbers) > 100
    found = []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        for value, where in _yaml_numbers(yaml.safe_load(path.read_text()), path.name):
            if value in numbers:
                found.append(where)
    for path in sorted((ROOT / "src" / "imgcls").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value in numbers:
                found.append(f"{path.name}:{node.lineno} {node.value}")
    assert found == []


def test_the_resolver_gives_the_row_and_refuses_an_unknown_name_or_field() -> None:
    assert resolve("tf2_efficientnet_b4_8xa100_tf32", "batch") == run_of("tf2_efficientnet_b4_8xa100_tf32").batch
    block = expected(run_of("resnet50_dgx1v_amp_90e"))
    assert list(block) == ["top1", "top1_std", "hours", "published_on"]  # mode=plan prints it in this order
    assert block["published_on"] == {"model": "resnet50", "hardware": "dgx1v", "precision": "amp", "gpus": 8}
    assert "published_on" not in expected(run_of("tf1_resnet50_dgx1v_amp_90e"))  # no TF img/s to scale by
    with pytest.raises(ConfigError, match=f"experiment=resnet51 has no row in {TABLE.name}"):
        resolve("resnet51", "expected")
    with pytest.raises(ConfigError, match="field=top5; allowed: batch, expected"):
        resolve("resnet50_dgx1v_amp_90e", "top5")


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_to_its_row(name: str) -> None:
    """The defaults of the file (model, hardware, precision, recipe) and its bases agree with the row."""
    run = run_of(name)
    cfg = compose_config([f"experiment={name}"])
    plan = resolve_plan(cfg, check_devices=False)
    composed = (cfg.model.name, cfg.hardware.name, cfg.precision.name, plan.world_size, cfg.recipe.epochs)
    assert composed == (run.model, run.hardware, run.precision, run.gpus, run.epochs)
    if run.batch is not None:
        assert plan.per_device_batch == run.batch
    assert OmegaConf.to_container(cfg.expected, resolve=True) == expected(run)


def test_the_docs_tables_are_the_published_table() -> None:
    """docs/recipes.md shows every experiment's published numbers as `python -m imgcls.config.published` prints them:
    the table is the one place they are typed in."""
    from imgcls.config.published import FRAMEWORKS, markdown, qat_markdown

    text = (ROOT / "docs" / "recipes.md").read_text()
    for framework in FRAMEWORKS:
        shown = re.search(rf"<!-- published:{framework} -->\n(.*?)<!-- /published:{framework} -->", text, re.S)
        assert shown is not None, framework
        assert shown.group(1) == markdown(framework), (
            f"docs/recipes.md: run python -m imgcls.config.published ({framework})"
        )
    shown = re.search(r"<!-- published:qat -->\n(.*?)<!-- /published:qat -->", text, re.S)
    assert shown is not None and shown.group(1) == qat_markdown(), "docs/recipes.md: python -m imgcls.config.published"
