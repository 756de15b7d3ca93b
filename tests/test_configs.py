"""Every config combination composes; the published recipes resolve to NVIDIA's numbers.

The expected numbers are read from NVIDIA's recipe tables (docs/reference/nvidia-recipe-tables.md §2.2 and
§2.3, transcribed from PYT/configs.yml), so a typo in a config cannot land.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from imgcls.config.compose import options
from imgcls.run.plan import resolve_plan
from tests.conftest import ROOT, compose_config

REFERENCE = ROOT / "docs" / "reference" / "nvidia-recipe-tables.md"  # travels with the repository
MODELS, PRECISIONS, HARDWARE, RECIPES = (options(g) for g in ("model", "precision", "hardware", "recipe"))

PLATFORMS = {
    "DGX1V (=DGX1V-16G/-32G)": ["dgx1v", "dgx1v_32g"],
    "DGX1V": ["dgx1v", "dgx1v_32g"],
    "DGX1V-16G": ["dgx1v"],
    "DGX1V-32G": ["dgx1v_32g"],
    "DGX2V": ["dgx2v"],
    "DGXA100": ["dgxa100"],
    "T4": ["t4"],
}
REF_MODELS = {
    "resnet50": "resnet50",
    "resnext101-32x4d": "resnext101_32x4d",
    "se-resnext101-32x4d": "se_resnext101_32x4d",
    "b0, widese-b0": "efficientnet_b0",
    "b4, widese-b4": "efficientnet_b4",
}
# The rows NVIDIA shares between a model and its wide-SE variant are checked for both.
WIDESE = {"efficientnet_b0": "efficientnet_widese_b0", "efficientnet_b4": "efficientnet_widese_b4"}


def _split(cell: str) -> list[str]:
    return [part.strip() for part in cell.split("/")]


def published_rows() -> list[dict]:
    """(model, hardware, precision) -> per-device batch, global batch, LR, WD, channels_last."""
    text = REFERENCE.read_text()
    rows = []
    for section, effnet in (("### 2.2 PyTorch ResNet family", False), ("### 2.3 PyTorch EfficientNet", True)):
        body = text[text.index(section) :]
        body = body[: body.index("\n\n**", body.index("| Model"))]
        for line in body.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 10 or cells[0] not in REF_MODELS:
                continue
            if effnet:  # Model | Platform | Prec. | bs/GPU | acc | LR | WD | image | mem. fmt | scripts
                model, platform, precs, bss, _acc, lr, wd, image, fmts = cells[:9]
                glob = ["4096"] * len(_split(precs))
            else:  # Model | Platform | Prec. | bs/GPU | GPUs | opt_bs | acc | LR | WD | mem. fmt | scripts
                model, platform, precs, bss, _gpus, opt_bs, _acc, lr, wd, fmts = cells[:10]
                image = "224"
                glob = _split(opt_bs) if "/" in opt_bs else [opt_bs] * len(_split(precs))
            for i, prec in enumerate(_split(precs)):
                bs = _split(bss)[i if "/" in bss else 0]
                fmt = _split(fmts)[i if "/" in fmts else 0]
                for hardware in PLATFORMS[platform]:
                    rows.append(
                        dict(
                            model=REF_MODELS[model],
                            hardware=hardware,
                            precision=prec.lower(),
                            per_device=int(bs),
                            global_batch=int(glob[i]),
                            lr=float(lr),
                            wd=float(wd),
                            image=int(image),
                            channels_last=fmt == "nhwc",
                        )
                    )
    assert len(rows) >= 40, "the reference tables could not be parsed"
    return rows + [{**row, "model": WIDESE[row["model"]]} for row in rows if row["model"] in WIDESE]


def _recipe_for(model: str) -> str:
    return "efficientnet" if model.startswith("efficientnet") else "90e"


@pytest.mark.slow
@pytest.mark.parametrize("row", published_rows(), ids=lambda r: "-".join(map(str, list(r.values())[:3])))
def test_published_recipe_resolves_to_nvidia_numbers(row: dict) -> None:
    cfg = compose_config(
        [
            f"model={row['model']}",
            f"hardware={row['hardware']}",
            f"precision={row['precision']}",
            f"recipe={_recipe_for(row['model'])}",
        ]
    )
    plan = resolve_plan(cfg, check_devices=False)
    # NVIDIA's DGX-2 runs used 8 processes with accumulation; ours use all 16 GPUs with the same
    # global and per-device batch, so only the accumulation differs.
    assert plan.per_device_batch == row["per_device"]
    assert plan.global_batch == row["global_batch"]
    assert plan.lr == pytest.approx(row["lr"])
    assert plan.weight_decay == pytest.approx(row["wd"])
    assert cfg.model.image_size == row["image"]
    assert cfg.model.channels_last is row["channels_last"]


@pytest.mark.slow
def test_recipe_constants_match_nvidia() -> None:
    for name, epochs, mixup in (("50e", 50, 0.0), ("90e", 90, 0.0), ("250e", 250, 0.2)):
        recipe = compose_config([f"recipe={name}"]).recipe
        assert (recipe.epochs, recipe.mixup, recipe.optimizer) == (epochs, mixup, "sgd")
        assert (recipe.momentum, recipe.warmup_epochs, recipe.label_smoothing) == (0.875, 8, 0.1)
        assert (recipe.lr_per_256, recipe.interpolation, recipe.augment) == (0.256, "bilinear", None)
    eff = compose_config(["model=efficientnet_b0", "recipe=efficientnet"]).recipe
    assert (eff.optimizer, eff.rmsprop_alpha, eff.rmsprop_eps, eff.momentum) == ("rmsprop", 0.9, 0.01, 0.9)
    assert (eff.epochs, eff.warmup_epochs, eff.mixup, eff.label_smoothing) == (400, 16, 0.2, 0.1)
    assert (eff.augment, eff.interpolation, eff.global_batch_size) == ("autoaugment", "bicubic", 4096)
    assert eff.lr_per_256 * 4096 / 256 == pytest.approx(0.08)
    b4 = compose_config(["model=efficientnet_b4", "recipe=efficientnet"]).recipe
    assert b4.lr_per_256 * 4096 / 256 == pytest.approx(0.16)


@pytest.mark.parametrize(
    "model,size,drop,drop_path",
    [
        ("efficientnet_b0", 224, 0.2, 0.0),
        ("efficientnet_b1", 240, 0.2, 0.0),
        ("efficientnet_b2", 260, 0.3, 0.0),
        ("efficientnet_b3", 300, 0.3, 0.0),
        ("efficientnet_b4", 380, 0.4, 0.2),
        ("efficientnet_b5", 456, 0.4, 0.0),
        ("efficientnet_b6", 528, 0.5, 0.0),
        ("efficientnet_b7", 600, 0.5, 0.0),
        ("resnet50", 224, 0.0, 0.0),
    ],
)
def test_model_defaults(model: str, size: int, drop: float, drop_path: float) -> None:
    cfg = compose_config([f"model={model}"])
    assert (cfg.model.image_size, cfg.model.drop_rate, cfg.model.drop_path_rate) == (size, drop, drop_path)
    assert cfg.data.image_size == size  # the data pipeline follows the model's size


@pytest.mark.slow
def test_every_combination_composes_and_plans() -> None:
    """model x precision x hardware x recipe: each group is composed by Hydra once, then combinations are
    merged the way Hydra merges group nodes and planned. The batch table is keyed by (model, precision,
    hardware), so every such triple is planned, each with a recipe in turn; the recipe's interplay with the model
    (LR per 256, WD) and the hardware (global batch) is covered by every (recipe, model) and (recipe, hardware)
    pair. That is a few hundred combinations instead of the full product's thousands (CI's time budget)."""

    def node(group: str, name: str) -> dict:
        return OmegaConf.to_container(compose_config([f"{group}={name}"])[group])  # unresolved

    # The keys planning reads; the rest of the root (hydra, logger, callbacks) is not group-dependent.
    base = {k: v for k, v in OmegaConf.to_container(compose_config([])).items() if k in ("data", "trainer")}
    # resolve_plan reads only these of data and trainer; a root of them is built ~4x faster than one of the whole
    # nodes (OmegaConf.create is most of this test's time). Combinations checked for every interpolation get it all.
    planned = {"data": {"batch_size": base["data"]["batch_size"]},
               "trainer": {k: base["trainer"][k] for k in ("devices", "accelerator", "num_nodes")}}  # fmt: skip
    nodes = {
        g: {n: node(g, n) for n in names}
        for g, names in (("model", MODELS), ("precision", PRECISIONS), ("hardware", HARDWARE), ("recipe", RECIPES))
    }
    count = 0
    triples = [
        (*mph, RECIPES[i % len(RECIPES)]) for i, mph in enumerate(itertools.product(MODELS, PRECISIONS, HARDWARE))
    ]
    with_model = [(m, PRECISIONS[0], HARDWARE[0], r) for m, r in itertools.product(MODELS, RECIPES)]
    with_hardware = [(MODELS[0], PRECISIONS[0], h, r) for h, r in itertools.product(HARDWARE, RECIPES)]
    combinations = set(triples + with_model + with_hardware)
    for m, p, h, r in sorted(combinations):
        resolves_all = (p, h) == (PRECISIONS[0], HARDWARE[0]) or m == "resnet50"
        # Hydra puts each chosen group node at its key; interpolations resolve against the new root.
        cfg = OmegaConf.create(
            {
                **(base if resolves_all else planned),
                "model": nodes["model"][m],
                "precision": nodes["precision"][p],
                "hardware": nodes["hardware"][h],
                "recipe": nodes["recipe"][r],
            }
        )
        plan = resolve_plan(cfg, check_devices=False)
        assert plan.global_batch == plan.per_device_batch * plan.world_size * plan.accumulation
        scaled = cfg.recipe.lr_per_256 * plan.global_batch / 256
        assert plan.lr == pytest.approx(cfg.recipe.lr if cfg.recipe.get("lr") else scaled)  # recipe.lr: absolute
        assert plan.weight_decay > 0
        if resolves_all:
            OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
        count += 1
    assert count == len(combinations) and len(MODELS) == 19
    assert {(m, r) for m, _, _, r in combinations} == set(itertools.product(MODELS, RECIPES))
    assert {(m, p, h) for m, p, h, _ in combinations} == set(itertools.product(MODELS, PRECISIONS, HARDWARE))


def test_groups_offer_the_documented_options() -> None:
    assert set(MODELS) == {
        "resnet18",
        "resnet34",
        "resnet50",
        "resnet101",
        "resnet152",
        "resnext50_32x4d",
        "resnext101_32x4d",
        "resnext101_32x8d",
        "se_resnext101_32x4d",
        *(f"efficientnet_b{i}" for i in range(8)),
        "efficientnet_widese_b0",
        "efficientnet_widese_b4",
    }
    assert set(PRECISIONS) == {"amp", "bf16", "tf32", "fp32"}
    assert set(HARDWARE) == {"auto", "dgx1v", "dgx1v_32g", "dgx2v", "dgxa100", "t4", "cpu"}
    assert set(RECIPES) == {"50e", "90e", "250e", "efficientnet", "tf1_90e", "tf1_250e", "tf2_efficientnet",
                            "tf2_efficientnet_stagewise", "qat", "qat_efficientnet_b0",
                            "qat_efficientnet_b4"}  # fmt: skip
    assert {"imagenet", "demo", "folder", "synthetic"} <= set(options("data"))
    assert {"csv", "tensorboard", "wandb"} <= set(options("logger"))


def test_every_config_value_names_its_source() -> None:
    """Recipe and hardware numbers carry a comment naming where they come from."""
    for group in ("recipe", "hardware"):
        for path in (ROOT / "conf" / group).glob("*.yaml"):
            for line in path.read_text().splitlines():
                if re.match(r"^\s*\w+:\s*(\{\s*half|-?\d[\d.]*(e-?\d+)?\s*(#|$))", line):
                    assert "#" in line, f"{path.name}: no source comment on {line.strip()!r}"


def test_an_experiment_is_named_by_its_file() -> None:
    """task_name (the run dir outputs/TASK_NAME/<time> and its TASK_NAME.log) is the experiment's file name,
    which train.yaml derives from Hydra's choice of experiment; train without one. (Every other experiment:
    test_plan_mode.py's test_every_experiment_has_a_plan, which composes each one anyway.)"""
    assert compose_config([]).task_name == "train"
    assert compose_config(["experiment=demo"]).task_name == "demo"


@pytest.mark.parametrize("name", [None, "demo", "tf1_resnet50_dgx2v_amp_250e"])
def test_hydra_run_names_its_dir_by_the_experiment(name: str | None) -> None:
    """As a Hydra run resolves it (hydra.core.utils.run_job): the run dir from the config with its `hydra` node,
    task_name in the task function's config (without that node) from the running app's HydraConfig."""
    overrides = [f"experiment={name}"] if name else []
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    before = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    try:
        assert re.fullmatch(rf"outputs/{name or 'train'}/[\d_-]+", cfg.hydra.run.dir)
        with open_dict(cfg):
            del cfg["hydra"]
        assert cfg.task_name == (name or "train")
    finally:
        HydraConfig.instance().cfg = before


def test_imagenet_root_comes_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IMAGENET_DIR", str(tmp_path))
    assert compose_config(["data=imagenet"]).data.root == str(tmp_path)


# The PyTorch runs; the TF seeds' runs (tf1_*, tf2_*) are checked against their own tables in test_tf_experiments.py.
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in options("experiment") if n != "demo" and not n.startswith("tf")])
def test_published_experiments_compose_with_their_expected_result(name: str) -> None:
    model, rest = next((m, name[len(m) + 1 :]) for m in MODELS if name.startswith(m + "_"))
    hardware, precision, epochs = rest.split("_")
    cfg = compose_config([f"experiment={name}"])
    assert (cfg.model.name, cfg.hardware.name, cfg.precision.name) == (model, hardware, precision)
    assert cfg.recipe.epochs == int(epochs.rstrip("e"))
    assert 70 < cfg.expected.top1 < 90 and cfg.expected.top1_std < 1
    resolve_plan(cfg, check_devices=False)
