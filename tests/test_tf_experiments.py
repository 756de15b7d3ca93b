"""The TF seeds' published runs (experiment/tf1_*, tf2_*) against NVIDIA's tables, and the DGX-2 50E warmup.

Every expected number is parsed from the verbatim copies in docs/reference/: the TF1 and TF2 recipe tables
(nvidia-recipe-tables.md §2.4, §2.5, and §2.2's 50-epoch history) and NVIDIA's published TF accuracy and
time-to-train tables (nvidia-published-results.md, Appendix A.6-A.10). Batch, GPU count, global batch, LR and
WD are read from imgcls's own plan (plan.resolve_plan), so a typo in a config, in a recipe or in the plan
arithmetic fails here.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import pytest
from omegaconf import DictConfig

from imgcls.config.compose import options
from imgcls.run.plan import resolve_plan
from tests.conftest import ROOT, compose_config

TABLES = (ROOT / "docs" / "reference" / "nvidia-recipe-tables.md").read_text()
RESULTS = (ROOT / "docs" / "reference" / "nvidia-published-results.md").read_text()
TF_EXPERIMENTS = [e for e in options("experiment") if e.startswith(("tf1_", "tf2_"))]

TF1_MODELS = {
    "resnet50": "resnet50",
    "resnext101-32x4d": "resnext101_32x4d",
    "se-resnext101-32x4d": "se_resnext101_32x4d",
}
TF1_PLATFORMS = {"DGX1": "dgx1v", "DGX2": "dgx2v", "DGXA100": "dgxa100"}
TF2_PLATFORMS = {"A100": "a100", "V100": "v100"}
PRECISIONS = {"AMP": "amp", "FP32": "fp32", "TF32": "tf32", "mixed precision": "amp"}


def _section(text: str, start: str, end: str = "\n### ") -> str:
    body = text[text.index(start) :]
    return body[: body.index(end, len(start))] if end in body[len(start) :] else body


def _rows(body: str) -> list[list[str]]:
    """The cells of every markdown table row in body (header and separator rows included)."""
    return [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in body.splitlines() if line.startswith("|")
    ]


def _flag(text: str, flag: str) -> str:
    """The value of a command-line flag in a recipe table's prose (`--momentum=0.875`, `--decay 0.9`)."""
    match = re.search(rf"`?{re.escape(flag)}[= ]([\w.\-]+)", text)
    assert match, f"{flag} not found in the reference"
    return match.group(1)


@functools.cache
def composed(name: str) -> tuple[DictConfig, Any]:
    cfg = compose_config([f"experiment={name}"])
    return cfg, resolve_plan(cfg, check_devices=False)


# ---------------------------------------------------------------------------------------------------------- TF1


def tf1_rows() -> dict[str, dict]:
    """§2.4: experiment name -> bs/GPU, GPUs, epochs, mixup, WD, loss scale, effective LR."""
    rows: dict[str, dict] = {}
    for cells in _rows(_section(TABLES, "### 2.4 TF1")):
        if len(cells) != 9 or cells[0] not in TF1_MODELS:
            continue  # header, separator, the QAT row
        model, script, gpus, bs, epochs, mixup, wd, amp, lr = cells
        precisions = re.findall(r"(AMP|FP32|TF32)", script)
        epoch_list = [int(e) for e in epochs.split("/")]
        by_precision = len(precisions) > 1  # "a / b" cells: one value per precision, else one per epoch count

        def pick(cell: str, i: int, j: int, by_precision: bool = by_precision) -> str:
            parts = [p.strip() for p in cell.split(" / ")]
            return parts[0] if len(parts) == 1 else parts[i if by_precision else j]

        for i, precision in enumerate(precisions):
            for j, epoch in enumerate(epoch_list):
                name = f"tf1_{TF1_MODELS[model]}_{TF1_PLATFORMS[script.split('_')[0]]}_{precision.lower()}_{epoch}e"
                rows[name] = dict(
                    per_device=int(pick(bs, i, j)),
                    gpus=int(pick(gpus, i, j)),
                    epochs=epoch,
                    mixup=float(mixup.split("/")[j] if "/" in mixup else mixup),
                    wd=float(wd),
                    loss_scale=pick(amp, i, j),
                    lr=float(pick(lr, i, j).split(" ")[0]),
                )
    assert len(rows) == 30, f"§2.4 parsed into {len(rows)} runs"
    return rows


TF1_ROWS = tf1_rows()


def test_every_tf1_script_has_an_experiment_and_no_more() -> None:
    assert sorted(TF1_ROWS) == sorted(e for e in TF_EXPERIMENTS if e.startswith("tf1_"))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TF1_ROWS))
def test_tf1_experiment_matches_its_script(name: str) -> None:
    row, common = TF1_ROWS[name], _section(TABLES, "### 2.4 TF1")
    cfg, plan = composed(name)
    recipe = cfg.recipe
    assert (plan.per_device_batch, plan.world_size, plan.accumulation) == (row["per_device"], row["gpus"], 1)
    assert plan.global_batch == row["per_device"] * row["gpus"]
    # TF1 scales --lr_init by GPUs x batch / 256; the table's "effective LR" column is that product.
    assert (
        plan.lr
        == pytest.approx(row["lr"])
        == pytest.approx(float(_flag(common, "--lr_init")) * plan.global_batch / 256)
    )
    # TF1 adds wd x tf.nn.l2_loss(w) = wd x sum(w^2) / 2 (TF1/model/resnet.py:297-298): a gradient of wd x w.
    assert plan.weight_decay == pytest.approx(row["wd"])
    assert recipe.weight_decay_on == "all_but_norm"  # TF1/model/resnet.py:283-293 skips BatchNorm only
    assert (recipe.epochs, recipe.mixup) == (row["epochs"], row["mixup"])
    assert recipe.warmup_epochs == float(_flag(common, "--lr_warmup_epochs"))
    assert (recipe.optimizer, recipe.momentum) == ("sgd", float(_flag(common, "--momentum")))
    assert recipe.label_smoothing == float(_flag(common, "--label_smoothing"))
    assert recipe.schedule == "cosine_tf1" and "--cosine_lr" in common  # cosine over all steps, warmup included
    assert cfg.model.conv_init == "tf1" and _flag(common, "--weight_init") == "fan_in"
    assert cfg.model.image_size == 224 and cfg.data.val_crop_padding == 32  # TF1 eval: 256 -> 224
    scale = row["loss_scale"]
    if scale == "–":
        assert cfg.precision.name in ("fp32", "tf32") and cfg.precision.loss_scale is None
    elif scale.startswith("static"):
        assert cfg.precision.name == "amp" and cfg.precision.loss_scale.dynamic is False
        assert cfg.precision.loss_scale.init_scale == float(scale.split()[1])
    else:
        assert scale.startswith("AMP dynamic") and cfg.precision.loss_scale.dynamic is True


# ---------------------------------------------------------------------------------------------------------- TF2


def tf2_rows() -> dict[str, dict]:
    """§2.5: experiment name of each 8-GPU script -> bs/GPU, GPUs, image, mixup, precision, effective LR, epochs."""
    rows: dict[str, dict] = {}
    for cells in _rows(_section(TABLES, "### 2.5 TF2")):
        if len(cells) != 9 or cells[0] not in ("B0", "B4"):
            continue
        model, script, gpus, bs, image, mixup, amp, lr, epochs = cells
        precision, platform = re.fullmatch(r"(AMP|TF32|FP32)/convergence_(\d+)x(A100|V100)-\d+G", script).group(1, 3)
        if int(gpus) != 8:
            continue  # the 1-GPU scripts: NVIDIA published no result for them
        name = f"tf2_efficientnet_{model.lower()}_8x{TF2_PLATFORMS[platform]}_{precision.lower()}"
        rows[name] = dict(per_device=int(bs), gpus=int(gpus), image=int(image), mixup=float(mixup),
                          amp=amp == "yes", precision=precision.lower(), lr=float(lr), epochs=int(epochs))  # fmt: skip
    assert len(rows) == 8, f"§2.5 parsed into {len(rows)} 8-GPU scripts"
    return rows


TF2_ROWS = tf2_rows()


def tf2_published_gpus() -> dict[str, int]:
    """A.10: every published TF2 run (model, platform, precision, GPU count) as an experiment name -> GPUs."""
    runs: dict[str, int] = {}
    for model, body in _tf2_accuracy_tables():
        for platform, precisions, cells in body:
            for prec in precisions:
                runs[f"tf2_efficientnet_{model}_{cells[0]}x{platform}_{prec}"] = int(cells[0])
    return runs


def _tf2_accuracy_tables() -> list[tuple[str, list[tuple[str, list[str], list[str]]]]]:
    """[(b0|b4, [(a100|v100, [other precision, amp], row cells), ...])] from A.10's accuracy tables."""
    out = []
    section = _section(RESULTS, "### A.10 TF2")
    for model in ("B0", "B4"):
        body = _section(
            section, f"**Training accuracy results for EfficientNet v1-{model}**", "**Training accuracy results"
        )
        tables = []
        for block in body.split("**Training accuracy:")[1:]:
            title, rows = block.split("**", 1)[0], _rows(block)
            platform = TF2_PLATFORMS["V100" if "V100" in title.split("(")[1] else "A100"]
            header = rows[0]
            other = PRECISIONS[header[1].removeprefix("Accuracy - ").strip()]
            assert header[2] == "Accuracy - mixed precision", header
            for cells in rows[2:]:
                tables.append((platform, [other, "amp"], cells))
        out.append((model.lower(), tables))
    return out


def test_every_tf2_script_and_published_run_has_an_experiment_and_no_more() -> None:
    assert sorted(set(TF2_ROWS) | set(tf2_published_gpus())) == sorted(
        e for e in TF_EXPERIMENTS if e.startswith("tf2_")
    )


@pytest.mark.parametrize("name", sorted(set(TF2_ROWS) | set(tf2_published_gpus())))
def test_tf2_experiment_matches_its_script(name: str) -> None:
    gpus = tf2_published_gpus().get(name, 8)
    script = re.sub(r"_\d+x", "_8x", name)  # the 8-GPU script of the same model, platform and precision
    row, common = TF2_ROWS[script], _section(TABLES, "### 2.5 TF2")
    cfg, plan = composed(name)
    recipe = cfg.recipe
    if gpus > 8:  # NVIDIA's multi-node launcher: its flags, cmdline_helper.py's defaults for the rest
        nodes = _section(TABLES, "#### TF2 multi-node launchers", "\n#")
        launcher = next(line for line in nodes.splitlines() if line.startswith(f"- {name.split('_')[2].upper()},"))
        row = {**row, "per_device": int(_flag(launcher, "--train_batch_size"))}
        assert (cfg.model.image_size, recipe.mixup) == (
            int(_flag(launcher, "--train_img_size")) if "--train_img_size" in launcher else 224,
            float(_flag(launcher, "--mixup_alpha")) if "--mixup_alpha" in launcher else 0.0,
        )
        assert (recipe.schedule, recipe.lr_decay_rate, recipe.lr_decay_epochs) == (
            _flag(nodes, "--lr_decay"),
            float(_flag(nodes, "--lr_decay_rate")),
            float(_flag(nodes, "--lr_decay_epochs")),
        )
        assert float(_flag(nodes, "--moving_average_decay")) == 0.0 and recipe.ema_decay is None  # no EMA
    assert (plan.per_device_batch, plan.world_size, plan.accumulation) == (row["per_device"], gpus, 1)
    assert (cfg.trainer.devices, cfg.trainer.num_nodes) == (8, gpus // 8)  # 8 GPUs a node: multi-node beyond 8
    assert plan.global_batch == row["per_device"] * gpus
    # TF2 scales --lr_init by the global batch / 128; the multi-node launchers leave it at its default.
    lr_init = float(_flag(nodes if gpus > 8 else common, "--lr_init"))
    assert plan.lr == pytest.approx(lr_init * plan.global_batch / 128)
    if gpus == 8:
        assert plan.lr == pytest.approx(row["lr"])  # the table's "effective LR" column
        assert recipe.ema_decay == float(_flag(common, "--moving_average_decay"))
        assert recipe.schedule == _flag(common, "--lr_decay") == "cosine"
    # Keras l2(c) adds c x sum(w^2) to the loss: a gradient of 2c x w, torch's coupled weight decay at twice the flag
    # (TF2/model/blocks/conv2d_block.py:57-58 hands --weight_decay to tf.keras.regularizers.l2).
    assert plan.weight_decay == pytest.approx(2 * float(_flag(common, "--weight_decay")))
    assert recipe.weight_decay_on == "all_but_norm_and_depthwise"
    assert (recipe.epochs, recipe.mixup, cfg.model.image_size) == (row["epochs"], row["mixup"], row["image"])
    if gpus > 8:
        assert recipe.epochs == int(_flag(nodes, "--max_epochs"))
    assert recipe.epochs == int(_flag(common, "--max_epochs"))
    assert recipe.warmup_epochs == float(_flag(common, "--lr_warmup_epochs"))
    # TF's RMSprop: rho --decay, --momentum, epsilon --opt_epsilon inside the square root (timm's RMSpropTF).
    assert (recipe.optimizer, _flag(common, "--optimizer")) == ("rmsprop_tf", "rmsprop")
    assert recipe.rmsprop_alpha == float(_flag(common, "--decay"))
    assert recipe.momentum == float(_flag(common, "--momentum"))
    assert recipe.rmsprop_eps == float(_flag(common, "--opt_epsilon"))
    assert recipe.label_smoothing == float(_flag(common, "--label_smoothing"))
    assert recipe.augment == _flag(common, "--augmenter_name") == "autoaugment"
    assert cfg.precision.name == row["precision"] and (cfg.precision.name == "amp") is row["amp"]
    if row["amp"]:
        assert cfg.precision.loss_scale.dynamic is True  # keras mixed_float16: dynamic loss scale
    assert cfg.trainer.sync_batchnorm is True and cfg.model.conv_init == "tf2"
    assert cfg.data.val_crop_padding == 32  # TF2 eval: central crop image_size / (image_size + 32)


# ------------------------------------------------------------------------------------------- published results


def _number(cell: str) -> float:
    return float(re.search(r"\d+(\.\d+)?", cell).group(0))


def _tf1_hardware(title: str) -> str:
    """The hardware of a README title: NVIDIA DGX A100 (8x A100 40GB) -> dgxa100, DGX-1 -> dgx1v, DGX-2 -> dgx2v."""
    return {"DGX A100": "dgxa100", "DGX-1": "dgx1v", "DGX-2": "dgx2v"}[re.match(r"NVIDIA (DGX[- ]\w+)", title).group(1)]


def published() -> tuple[dict[str, tuple[float | None, float | None]], dict[str, dict[str, int]]]:
    """Experiment name -> (top-1, hours) of every TF result table in nvidia-published-results.md, and the
    per-GPU batch and GPU count the TF1 tables name for their rows (parsed only: composing configs here would
    cost every xdist worker ~12 s at collection)."""
    top1: dict[str, float] = {}
    hours: dict[str, float] = {}
    shapes: dict[str, dict[str, int]] = {}
    sections = {"resnet50": "### A.7 TF1", "resnext101_32x4d": "### A.8 TF1", "se_resnext101_32x4d": "### A.9 TF1"}
    for model, start in sections.items():
        body = _section(RESULTS, start)
        for block in body.split("**Training accuracy: ")[1:]:
            title, rows = block.split("**", 1)[0], _rows(block.split("**Training", 1)[0])
            hardware = _tf1_hardware(title)
            header = rows[0]
            for cells in rows[2:]:
                for column, cell in zip(header[2:], cells[2:]):
                    prec = PRECISIONS[re.sub(r"Accuracy - | \(top1\)", "", column).strip()]
                    name = f"tf1_{model}_{hardware}_{prec}_{cells[0]}e"
                    top1[name] = _number(cell)
                    bs = re.findall(r"(\d+)(?: \((\w+)\))?", cells[1])  # "128 (FP32) / 256 (AMP)" or "256"
                    per_device = next(int(b) for b, p in bs if not p or PRECISIONS[p] == prec)
                    shapes.setdefault(name, {})["per_device_batch"] = per_device
        for block in body.split("**Training time: ")[1:]:
            title, rows = block.split("**", 1)[0], _rows(block.split("**Inference", 1)[0])
            hardware = _tf1_hardware(title)
            header = rows[0]
            for cells in rows[2:]:
                if cells[0] == "1":
                    continue  # single-GPU estimates: no experiment runs on one GPU
                for column, cell in zip(header[1:], cells[1:]):
                    prec = PRECISIONS[re.sub(r"Time to train - | \+ XLA", "", column).strip()]
                    name = f"tf1_{model}_{hardware}_{prec}_90e"  # "Training Time for 90 Epochs"
                    shapes.setdefault(name, {})["world_size"] = int(cells[0])
                    hours[name] = _number(cell)
    for model, tables in _tf2_accuracy_tables():
        for platform, precisions, cells in tables:
            for k, prec in enumerate(precisions):
                name = f"tf2_efficientnet_{model}_{cells[0]}x{platform}_{prec}"
                top1[name], hours[name] = _number(cells[1 + k]), _number(cells[3 + k])
    assert len(top1) == 18 + 16 and len(hours) == 18 + 16, (len(top1), len(hours))
    return {name: (top1.get(name), hours.get(name)) for name in set(top1) | set(hours)}, shapes


PUBLISHED, PUBLISHED_SHAPES = published()


@pytest.mark.parametrize("name", sorted(PUBLISHED_SHAPES))
def test_tf1_experiment_has_the_batch_and_gpus_of_its_published_row(name: str) -> None:
    plan = composed(name)[1]
    assert {key: getattr(plan, key) for key in PUBLISHED_SHAPES[name]} == PUBLISHED_SHAPES[name]


@pytest.mark.parametrize("name", TF_EXPERIMENTS)
def test_tf_experiment_expects_the_published_result(name: str) -> None:
    """Each TF experiment carries NVIDIA's published top-1 and time, or null where NVIDIA published none."""
    top1, hours = PUBLISHED.get(name, (None, None))
    expected = composed(name)[0].expected
    assert expected.top1 == (pytest.approx(top1) if top1 is not None else None)
    assert expected.hours == (pytest.approx(hours) if hours is not None else None)
    assert expected.top1_std is None  # TF READMEs publish one run


def test_published_tables_hold_no_run_without_an_experiment() -> None:
    assert set(PUBLISHED) <= set(TF_EXPERIMENTS)


# -------------------------------------------------------------------------------------- §3: DGX-2 50-epoch runs


@pytest.mark.parametrize("precision", ["amp", "fp32"])
def test_dgx2_50_epoch_runs_match_nvidia_scripts(precision: str) -> None:
    """DGX2_RN50_{AMP,FP32}_50E.sh (§2.2 history): 16 processes, warmup 16, global 4096, -b 256 (AMP) / 128 (FP32)."""
    rows = {c[0]: c[1] for c in _rows(_section(TABLES, "**50-epoch recipe", "\n\nThe 90E/250E")) if len(c) == 2}
    amp_cmd = rows["DGX2_RN50_AMP_50E"]
    cmd = rows[f"DGX2_RN50_{precision.upper()}_50E"]
    flags = amp_cmd if cmd.startswith("same") else cmd  # "same, `-b 128` (acc 2)": the AMP line with another -b
    cfg, plan = composed(f"resnet50_dgx2v_{precision}_50e")
    assert cfg.recipe.warmup_epochs == float(_flag(flags, "--warmup"))
    assert cfg.recipe.epochs == int(_flag(flags, "--epochs"))
    assert plan.world_size == int(_flag(flags, "--nproc_per_node"))
    assert plan.global_batch == int(_flag(flags, "--optimizer-batch-size"))
    assert plan.lr == pytest.approx(float(_flag(flags, "--lr")))
    assert plan.per_device_batch == int(_flag(cmd, "-b"))
