"""One typed schema per config group (Hydra's "Structured Configs" pattern, schema for YAML files): a dataclass per
group whose fields name every key the group's YAML options may set, each with its type, its default, a one-line
meaning, where the value comes from NVIDIA its source, and what it allows (`field(metadata=_about(...))`: read by
config/checks.py, whose tables are made from it, by docs/config-keys.md and by tests).

A group option extends its schema (`defaults: [_schema, _self_]`, registered below in Hydra's ConfigStore as
GROUP/_schema) and writes only the values that differ from the defaults here; a key only some options set is
Optional with default None. Free-form namespaces stay mappings: data.storage_options (fsspec's options) and the
hardware batch table (profile -> memory class -> per_device / global / weight_decay; `global` is a Python keyword,
so a row is a mapping, not a dataclass; its rows' ranges are config/checks.py's BATCH_ROWS). The cross-key rules
are config/checks.py's. `X | None` is OmegaConf's Optional; it takes no other Union, so a
key that may be an int or a string (hardware.devices: 8, "auto" or a list) is Any.
"""

# ruff: noqa: E501  (a field's meaning is one line, as docs/config-keys.md shows it)

from __future__ import annotations

from dataclasses import MISSING as _NO_DEFAULT
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from imgcls.config.choices import (
    ACCELERATORS,
    AUGMENTS,
    AUTOAUGMENT_OPS,
    AUTOAUGMENT_POLICIES,
    BAD_IMAGE_POLICIES,
    CALIBRATORS,
    CONV_INITS,
    DALI_TRAIN_RESIZES,
    DATA_BACKENDS,
    DROP_PATH_MASKS,
    LR_INTERVALS,
    MIXUP_MODES,
    OPTIMIZERS,
    PROGRESS_BARS,
    QUANTIZER_SETS,
    SCHEDULES,
    STRATEGIES,
    VALIDATION_METRICS,
    WEIGHT_DECAY_SETS,
)
from imgcls.config.ranges import (
    COUNT,
    POSITIVE,
    POSITIVE_OR_NULL,
    RATE,
    SEED,
    STEPS_LIMIT,
    TRAIN_CROP,
    WEIGHT_DECAY,
    Check,
    anything,
    boolean,
    choice,
    folder,
    integer,
    lightning_devices,
    limit_batches,
    not_barebones,
    number,
    numbers,
    or_null,
)


def _about(meaning: str, source: str = "", allowed: Check = anything) -> dict[str, Any]:
    """A field's metadata: what it means, where its value comes from (NVIDIA's file:line or a named doc, or empty)
    and what it allows (config/ranges.py; `anything`: checked where it is used, or free-form)."""
    return {"meaning": meaning, "source": source, "allowed": allowed}


def _ref(interpolation: str) -> Any:
    """An interpolation as a typed field's default (OmegaConf resolves it to the field's type when read)."""
    return interpolation


@dataclass
class BenchmarkSchema:
    """benchmark."""

    warmup: int = field(default=10, metadata=_about("untimed iterations", allowed=COUNT))
    iterations: int = field(
        default=50,
        metadata=_about(
            "timed iterations (micro-batches); no epoch end, checkpoint or validation among them", allowed=POSITIVE
        ),
    )


@dataclass
class TrainSchema:
    """train.yaml."""

    task_name: Any = field(
        default=_ref("${imgcls.choice:experiment,train}"),
        metadata=_about("run dirs outputs/TASK_NAME/...: the experiment's file name, else train"),
    )
    mode: str = field(
        default="train",
        metadata=_about(
            "train | benchmark (NVIDIA benchmark_training: timed iterations, no ckpt, no val) | plan (print the resolved batch, LR, WD, steps for any machine; no data, no GPU)",
            source="PYT/launch.py --mode benchmark_training",
            allowed=choice("train", "benchmark", "plan"),
        ),
    )
    seed: int = field(
        default=12345,
        metadata=_about(
            "global-rank offset is added per process (NVIDIA seeded by local rank only)",
            source="PYT/main.py --seed",
            allowed=SEED,
        ),
    )
    deterministic: bool = field(
        default=False,
        metadata=_about("Lightning's deterministic mode (slower; bitwise-reproducible kernels)", allowed=boolean),
    )
    ckpt_path: Any = field(
        default=None, metadata=_about("resume: a .ckpt path, or `last` for this run dir's checkpoints/last.ckpt")
    )
    compile: bool = field(
        default=False,
        metadata=_about("torch.compile the network (PyTorch's counterpart of the seeds' XLA switch)", allowed=boolean),
    )
    run_dir: Any = field(
        default=_ref("${hydra:runtime.output_dir}"),
        metadata=_about("everything of the run goes here; set with hydra.run.dir=DIR"),
    )
    expected: Any = field(
        default=None,
        metadata=_about("an experiment's published result ({top1, top1_std, hours}), copied to report.json"),
    )
    benchmark: BenchmarkSchema = field(
        default_factory=BenchmarkSchema,
        metadata=_about("mode=benchmark only: one epoch of warmup + iterations batches a rank"),
    )


@dataclass
class ModelSchema:
    """model."""

    name: str = field(default=MISSING, metadata=_about(""))
    arch: str = field(default=MISSING, metadata=_about("timm architecture, built with pretrained=False"))
    image_size: int = field(
        default=MISSING,
        metadata=_about(
            "the network's input size (data.image_size follows it)",
            source="PYT/main.py --image-size (model.arch.default_image_size)",
            allowed=POSITIVE,
        ),
    )
    drop_rate: float = field(
        default=MISSING,
        metadata=_about(
            "ResNets have no head dropout in NVIDIA's code",
            source="IC/models/model.py EntryPoint.parser --dropout",
            allowed=RATE,
        ),
    )
    drop_path_rate: float = field(
        default=0.0,
        metadata=_about(
            "no stochastic depth (NVIDIA's ResNets have none; PYT/main.py --survival_prob absent)",
            source="IC/models/model.py EntryPoint.parser --survival_prob",
            allowed=RATE,
        ),
    )
    conv_init: str = field(
        default=MISSING,
        metadata=_about(
            "Kaiming normal; NVIDIA --conv_init default (every recipe used fan_in)",
            source="IC/models/model.py EntryPoint.parser --conv_init",
            allowed=choice(*CONV_INITS),
        ),
    )
    zero_init_last_bn: bool = field(
        default=False,
        metadata=_about(
            "NVIDIA --last_bn_0_init default (no recipe sets it)",
            source="IC/models/model.py EntryPoint.parser --last_bn_0_init",
            allowed=boolean,
        ),
    )
    drop_path_mask: str = field(
        default="sample",
        metadata=_about("timm's per-sample DropPath when drop_path_rate > 0", allowed=choice(*DROP_PATH_MASKS)),
    )
    bn_momentum: float | None = field(
        default=None, metadata=_about("null = PyTorch default 0.1", allowed=number(0, 1, open_low=True, null=True))
    )
    bn_eps: float | None = field(
        default=None, metadata=_about("null = PyTorch default 1e-5", allowed=number(0, open_low=True, null=True))
    )
    weight_decay: float = field(
        default=MISSING,
        metadata=_about(
            "1/32768 (NVIDIA PYT/resnet50v1.5/README 'Optimizer')",
            source='PYT/resnet50v1.5/README.md "Optimizer"',
            allowed=WEIGHT_DECAY,
        ),
    )
    lr_per_256: float | None = field(
        default=None, metadata=_about("null = the recipe's value", allowed=number(0, open_low=True, null=True))
    )
    batch_profile: str = field(default=MISSING, metadata=_about(""))
    batch_divisor: int = field(default=1, metadata=_about("", allowed=POSITIVE))
    weights: Any = field(
        default=None, metadata=_about("weights-only file to initialize from (head replaced if classes differ)")
    )
    channels_last: bool = field(
        default=False,
        metadata=_about("NHWC network memory format (the root models follow the precision's)", allowed=boolean),
    )
    se_width: int | None = field(
        default=None,
        metadata=_about(
            "null = C/16 (paper, TF1); 16 = NVIDIA PyTorch",
            allowed=integer(1, null=True),
        ),
    )
    wide_se: bool | None = field(
        default=None,
        metadata=_about(
            "true: NVIDIA's widese SE (0.25 x expanded channels; model/efficientnet_widese_b0)",
            source="PYT/main.py available_models() efficientnet-widese-b0",
            allowed=or_null(boolean),
        ),
    )


@dataclass
class PrecisionLossScaleSchema:
    """precision.loss_scale."""

    dynamic: bool = field(
        default=MISSING,
        metadata=_about(
            "false: the scale stays init_scale (TF1 --static_loss_scale); an overflow still skips",
            source="TF1/main.py --static_loss_scale",
            allowed=boolean,
        ),
    )
    init_scale: float = field(
        default=MISSING,
        metadata=_about(
            "GradScaler's first scale (NVIDIA's AMP recipes: 128)",
            source="PYT/configs.yml static_loss_scale",
            allowed=number(0, open_low=True),
        ),
    )
    growth_factor: float = field(
        default=MISSING,
        metadata=_about(
            "the scale is multiplied by this after growth_interval steps without an overflow",
            source="IC/training.py GradScaler",
            allowed=number(1, open_low=True),
        ),
    )
    backoff_factor: float = field(
        default=MISSING, metadata=_about("", allowed=number(0, 1, open_low=True, open_high=True))
    )
    growth_interval: int = field(default=MISSING, metadata=_about("", allowed=POSITIVE))


@dataclass
class PrecisionSchema:
    """precision."""

    name: str = field(default=MISSING, metadata=_about(""))
    lightning: str = field(default=MISSING, metadata=_about(""))
    memory_class: str = field(default=MISSING, metadata=_about("", allowed=choice("full", "half")))
    channels_last: bool = field(
        default=MISSING,
        metadata=_about("NVIDIA FP32 recipes use nchw", source="PYT/main.py --memory-format", allowed=boolean),
    )
    tf32: bool = field(default=MISSING, metadata=_about("", allowed=boolean))
    cpu_fp16: bool = field(
        default=False,
        metadata=_about("true: fp16 autocast + GradScaler('cpu') instead of the bf16 fallback", allowed=boolean),
    )
    max_consecutive_overflows: int | None = field(default=None, metadata=_about("", allowed=POSITIVE_OR_NULL))
    loss_scale: PrecisionLossScaleSchema | None = field(
        default=None,
        metadata=_about(
            "GradScaler's settings (amp); null: NVIDIA's main.py default scaler", source="PYT/main.py:262-267"
        ),
    )


@dataclass
class HardwareSchema:
    """hardware."""

    name: str = field(
        default=MISSING,
        metadata=_about(
            "replaced by the chosen profile's name at start (imgcls.config.hardware.resolve_auto_hardware)"
        ),
    )
    accelerator: str = field(default=MISSING, metadata=_about("", allowed=choice(*ACCELERATORS)))
    devices: Any = field(
        default=MISSING,
        metadata=_about("one process; trainer.devices=2 for 2-process DDP (gloo)", allowed=lightning_devices),
    )
    num_workers: int = field(default=MISSING, metadata=_about("one loader worker per core", allowed=COUNT))
    prefetch_factor: int | None = field(default=MISSING, metadata=_about("PyTorch default", allowed=POSITIVE_OR_NULL))
    pin_memory: bool = field(default=MISSING, metadata=_about("", allowed=boolean))
    data_backend: str = field(default=MISSING, metadata=_about("", allowed=choice(*DATA_BACKENDS)))
    auto: str | None = field(
        default=None,
        metadata=_about("why hardware=auto chose this profile (config/hardware.py), kept in the run's config.yaml"),
    )
    batch: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=dict,
        metadata=_about(
            "per-device and global (optimizer) batch, and the weight decay of NVIDIA's batch anchor, by model.batch_profile and precision.memory_class",
            source="PYT/configs.yml, per platform",
        ),
    )


@dataclass
class RecipeQatSchema:
    """recipe.qat."""

    calibration_images: int = field(
        default=MISSING,
        metadata=_about(
            "the activation ranges' first values (TF1's QAT has no calibration: its ranges are moving min/max averages, tf.contrib.quantize); 10 batches of 128",
            allowed=POSITIVE,
        ),
    )
    calibration_batch_size: int = field(
        default=MISSING, metadata=_about("images per calibration forward pass", allowed=POSITIVE)
    )
    seed: int = field(
        default=MISSING, metadata=_about("which training images calibrate (the same on every rank)", allowed=integer(0))
    )
    calibration_preprocessing: str = field(
        default=MISSING,
        metadata=_about(
            "val: what deployment feeds; train: the training augmentation (NVIDIA PyTorch)",
            allowed=choice("val", "train"),
        ),
    )
    calibrator: str = field(
        default=MISSING,
        metadata=_about(
            "max: the largest |activation| (modelopt's default, closest to TF1's min/max); percentile: NVIDIA PyTorch's histogram at `percentile`",
            allowed=choice(*CALIBRATORS),
        ),
    )
    percentile: float = field(
        default=MISSING, metadata=_about("calibrator=percentile only", allowed=number(0, 100, open_low=True))
    )
    quantizers: str = field(
        default=MISSING,
        metadata=_about(
            "conv/linear/pool inputs and weights; nvidia: + SE multiply and residual inputs",
            allowed=choice(*QUANTIZER_SETS),
        ),
    )


@dataclass
class RecipeSchema:
    """recipe."""

    name: str = field(default=MISSING, metadata=_about(""))
    epochs: int = field(default=MISSING, metadata=_about("90E scripts: --epochs 90", allowed=POSITIVE))
    warmup_epochs: float = field(
        default=MISSING,
        metadata=_about(
            "epochs of LR warmup before the schedule", source="PYT/configs.yml resnet_params warmup", allowed=number(0)
        ),
    )
    optimizer: str = field(default=MISSING, metadata=_about("", allowed=choice(*OPTIMIZERS)))
    momentum: float = field(
        default=MISSING,
        metadata=_about("the optimizer's momentum", source="PYT/configs.yml resnet_params momentum", allowed=RATE),
    )
    nesterov: bool = field(
        default=False,
        metadata=_about("NVIDIA default; no recipe uses it", source="PYT/main.py --nesterov", allowed=boolean),
    )
    rmsprop_alpha: float | None = field(
        default=None,
        metadata=_about(
            "set by the RMSprop recipes (efficientnet, tf2_efficientnet)",
            allowed=number(0, 1, open_low=True, open_high=True, null=True),
        ),
    )
    rmsprop_eps: float | None = field(default=None, metadata=_about("", allowed=number(0, open_low=True, null=True)))
    rmsprop_initial_square_avg: float | None = field(
        default=None,
        metadata=_about(
            "where the RMSprop square average starts; null: the optimizer's own (rmsprop: torch's 0; rmsprop_tf: "
            "timm's 1, TF1's slot). tf2_efficientnet: 0, Keras' slot",
            source="TF2/utils/optimizer_factory.py:264-271 (tf.keras.optimizers.RMSprop)",
            allowed=number(0, null=True),
        ),
    )
    lr_per_256: float = field(
        default=MISSING,
        metadata=_about(
            "peak LR per 256 images of the global batch (NVIDIA: 0.256)",
            source='PYT/resnet50v1.5/README.md "Optimizer"',
            allowed=number(0, open_low=True),
        ),
    )
    lr: float | None = field(
        default=None,
        metadata=_about(
            "an absolute peak LR instead of lr_per_256 x global batch / 256 (NVIDIA --lr)",
            source="PYT/main.py --lr",
            allowed=number(0, open_low=True, null=True),
        ),
    )
    end_lr: float = field(
        default=0.0,
        metadata=_about("the LR the schedule ends at", source="PYT/main.py --end-lr", allowed=number(0)),
    )
    schedule: str = field(
        default=MISSING,
        metadata=_about(
            "cosine | linear | step (NVIDIA --lr-schedule), stepped every optimizer step",
            source="PYT/main.py --lr-schedule",
            allowed=choice(*SCHEDULES),
        ),
    )
    lr_milestones: list[float] = field(
        default=MISSING,
        metadata=_about(
            "schedule=step: x0.1 at these epochs (NVIDIA main.py lr_step_policy, hard-coded there)",
            source="PYT/main.py lr_step_policy",
            allowed=numbers(None, 0, ordered=True),
        ),
    )
    lr_decay_rate: float | None = field(
        default=None,
        metadata=_about(
            "schedule=exponential: TF2/utils/cmdline_helper.py:178 --lr_decay_rate default",
            source="TF2/utils/cmdline_helper.py:178",
            allowed=number(0, 1, open_low=True, null=True),
        ),
    )
    lr_decay_epochs: float | None = field(
        default=None,
        metadata=_about(
            "schedule=exponential: TF2/utils/cmdline_helper.py:180 --lr_decay_epochs default",
            source="TF2/utils/cmdline_helper.py:180",
            allowed=number(0, open_low=True, null=True),
        ),
    )
    lr_interval: str = field(
        default="step",
        metadata=_about(
            "the LR changes every optimizer step (epoch: NVIDIA PyTorch's lr_policy)",
            source="IC/optimizers.py lr_policy",
            allowed=choice(*LR_INTERVALS),
        ),
    )
    global_batch_size: int | None = field(
        default=None,
        metadata=_about(
            "null = hardware profile table (NVIDIA optimizer_batch_size)",
            source="PYT/main.py --optimizer-batch-size",
            allowed=POSITIVE_OR_NULL,
        ),
    )
    weight_decay: float | None = field(
        default=None,
        metadata=_about(
            "null = the hardware row's value, else the model's (1/32768 RN50, 1/16384 RNXt)",
            allowed=number(0, null=True),
        ),
    )
    weight_decay_on: str = field(
        default=MISSING,
        metadata=_about(
            "NVIDIA bn_weight_decay False excludes BN; imgcls also excludes biases",
            source="PYT/main.py bn_weight_decay",
            allowed=choice(*WEIGHT_DECAY_SETS),
        ),
    )
    label_smoothing: float = field(
        default=0.0,
        metadata=_about(
            "no smoothing (the recipes set NVIDIA's 0.1)",
            source="PYT/main.py --label-smoothing",
            allowed=RATE,
        ),
    )
    mixup: float = field(default=0.0, metadata=_about("Beta(alpha, alpha); 0 = off", allowed=number(0)))
    cutmix: float = field(
        default=0.0,
        metadata=_about(
            "0 = off (not in NVIDIA's PyTorch code; TF2 has it)",
            source="TF2/utils/cmdline_helper.py --cutmix_alpha",
            allowed=number(0),
        ),
    )
    mixup_mode: str = field(
        default="batch",
        metadata=_about(
            "PYT image_classification/mixup.py:22: one np.random.beta lambda per batch",
            source="PYT/image_classification/mixup.py:22",
            allowed=choice(*MIXUP_MODES),
        ),
    )
    augment: str | None = field(
        default=None, metadata=_about("null | autoaugment | randaugment", allowed=or_null(choice(*AUGMENTS)))
    )
    autoaugment_policy: str = field(
        default=MISSING,
        metadata=_about(
            "PYT IC/autoaugment.py:12-42 (--augmentation autoaugment) is the v0 list, 250 px translate",
            source="PYT/image_classification/autoaugment.py:12-42",
            allowed=choice(*AUTOAUGMENT_POLICIES),
        ),
    )
    autoaugment_ops: str = field(
        default="pytorch",
        metadata=_about(
            "augment=autoaugment: whose Posterize, Solarize and Shear run the policy: pytorch (NVIDIA PYT autoaugment.py, PIL) | tf2 (NVIDIA TF2 augment.py as TensorFlow runs it)",
            source="PYT IC/autoaugment.py; TF2 dataloader/augment.py",
            allowed=choice(*AUTOAUGMENT_OPS),
        ),
    )
    interpolation: str = field(
        default=MISSING,
        metadata=_about(
            "the resize interpolation (data.interpolation follows it)",
            source="PYT/configs.yml resnet_params interpolation",
        ),
    )
    train_crop: str = field(
        default="random_resized",
        metadata=_about(
            "random_resized: torchvision's RandomResizedCrop (DALI: its random crop) | tf: TF's sample_distorted_bounding_box (data/tf_crop.py)",
            source="TF1/utils/image_processing.py:52-61",
            allowed=TRAIN_CROP,
        ),
    )
    train_crop_object_boxes: bool = field(
        default=False,
        metadata=_about(
            "train_crop=tf: crop around the TFRecords' object boxes (TF1 image_processing.py:33-43); false: the whole image",
            source="TF1/utils/image_processing.py:33-43",
            allowed=boolean,
        ),
    )
    ema_decay: float | None = field(
        default=None,
        metadata=_about(
            "no EMA (NVIDIA --use-ema off)",
            source="PYT/main.py --use-ema",
            allowed=number(0, 1, open_low=True, open_high=True, null=True),
        ),
    )
    ema_dynamic_decay: bool = field(
        default=False,
        metadata=_about(
            "with ema_decay: timm's (weights copied at the first update, then a constant decay); true: NVIDIA's ramp min(decay, (1 + t) / (10 + t)) from the network as built (training/ema.py)",
            source="IC/models/common.py EMA",
            allowed=boolean,
        ),
    )
    ema_ramp: str = field(
        default="pytorch",
        metadata=_about(
            "with ema_dynamic_decay: how t counts steps. pytorch: t = 0 at the first update (PYT/image_classification/training.py:226, models/common.py:196-200); tf2: t = 1, float32 (TF2/utils/optimizer_factory.py:149-153, :195-202)",
            source="PYT/image_classification/training.py:226; TF2/utils/optimizer_factory.py:149-153",
            allowed=choice("pytorch", "tf2"),
        ),
    )
    stagewise: bool = field(
        default=False,
        metadata=_about(
            "stage-wise training (TF2 --n_stages > 1): turns data.progressive on with the stage schedule",
            source="TF2/utils/cmdline_helper.py --n_stages",
            allowed=boolean,
        ),
    )
    stages: int | None = field(
        default=None,
        metadata=_about(
            "stage-wise: the number of stages (TF2 --n_stages); null: a linear ramp",
            source="TF2/utils/cmdline_helper.py --n_stages",
            allowed=POSITIVE_OR_NULL,
        ),
    )
    base_image_size: int = field(
        default=160,
        metadata=_about(
            "progressive resizing: the first epoch's or stage's image size (FFCV rn50 min_res 160; TF2 --base_img_size 128)",
            source="TF2/utils/cmdline_helper.py --base_img_size",
            allowed=POSITIVE,
        ),
    )
    base_randaug_magnitude: int | None = field(
        default=None,
        metadata=_about(
            "stage-wise: the first stage's RandAugment magnitude (TF2 --base_randaug_mag); null: data.randaugment's throughout",
            source="TF2/utils/cmdline_helper.py --base_randaug_mag",
            allowed=integer(0, null=True),
        ),
    )
    randaugment: str = field(
        default="rand-m9-mstd0.5",
        metadata=_about("timm RandAugment policy string used when augment=randaugment"),
    )
    qat: RecipeQatSchema | None = field(
        default=None,
        metadata=_about("recipe=qat: fake INT8 quantizers calibrated on training images (quantization/qat.py)"),
    )


@dataclass
class DataProgressiveSchema:
    """data.progressive: the train size grows with the epoch, val runs at end_size (imgcls/data/progressive.py).

    Two schedules: a linear ramp (FFCV ffcv-imagenet train_imagenet.py get_resolution: 160->192 between start_ramp
    and end_ramp, snapped to multiples of 32) or stages (TF2 EfficientNet --n_stages: size = base + (target - base)
    x (stage + 1) / n_stages, epochs // n_stages epochs per stage)."""

    enabled: bool = field(
        default=_ref("${oc.select:recipe.stagewise,false}"),
        metadata=_about("a stage-wise recipe (recipe/tf2_efficientnet_stagewise) turns it on", allowed=boolean),
    )
    start_size: int = field(
        default=_ref("${oc.select:recipe.base_image_size,160}"),
        metadata=_about(
            "FFCV rn50 min_res 160 (TF2 --base_img_size 128)",
            source="FFCV rn50 config min_res; TF2/utils/cmdline_helper.py --base_img_size",
            allowed=POSITIVE,
        ),
    )
    end_size: int | None = field(
        default=None,
        metadata=_about(
            "null = image_size (FFCV rn50 max_res 192, TF2 --train_img_size)",
            source="FFCV rn50 config max_res",
            allowed=POSITIVE_OR_NULL,
        ),
    )
    stages: int | None = field(
        default=_ref("${oc.select:recipe.stages,null}"),
        metadata=_about(
            "null = linear ramp; N = TF2 stage-wise schedule with N stages",
            source="TF2/utils/cmdline_helper.py --n_stages",
            allowed=POSITIVE_OR_NULL,
        ),
    )
    start_epoch: int = field(
        default=0,
        metadata=_about(
            "ramp only: last epoch at start_size (FFCV start_ramp, 65 of 88 for rn50)",
            source="FFCV rn50 config start_ramp",
            allowed=COUNT,
        ),
    )
    end_epoch: int | None = field(
        default=None,
        metadata=_about(
            "ramp only: first epoch at end_size (FFCV end_ramp, 76 of 88); null = last epoch",
            source="FFCV rn50 config end_ramp",
            allowed=POSITIVE_OR_NULL,
        ),
    )
    multiple_of: int = field(
        default=32,
        metadata=_about(
            "ramp only: sizes snapped to this multiple (FFCV 32)",
            source="FFCV rn50 config",
            allowed=POSITIVE,
        ),
    )
    total_epochs: int = field(
        default=_ref("${recipe.epochs}"),
        metadata=_about(
            "stages: epochs_per_stage = total_epochs // stages (TF2 max_epochs // n_stages)",
            source="TF2/utils/cmdline_helper.py --max_epochs, --n_stages",
            allowed=POSITIVE,
        ),
    )
    start_magnitude: int | None = field(
        default=_ref("${oc.select:recipe.base_randaug_magnitude,null}"),
        metadata=_about(
            "RandAugment magnitude of the first epoch/stage, ramped to data.randaugment's (TF2 --base_randaug_mag 5)",
            source="TF2/utils/cmdline_helper.py --base_randaug_mag",
            allowed=integer(0, null=True),
        ),
    )


@dataclass
class DataSchema:
    """data."""

    name: str = field(default=MISSING, metadata=_about(""))
    root: Any = field(default=MISSING, metadata=_about(""))
    backend: Any = field(
        default=_ref("${hardware.data_backend}"),
        metadata=_about(
            "torchvision | dali_cpu | dali_gpu | synthetic (NVIDIA --data-backend)",
            source="PYT/main.py --data-backend",
            allowed=choice(*DATA_BACKENDS),
        ),
    )
    format: str = field(
        default="folder",
        metadata=_about(
            "folder: ROOT/{train,val}/<class>/<image>. webdataset | tfrecord: shard files in ROOT (train-*, validation-*; manifest.json from `python -m imgcls.data.shards convert`); ROOT may be a URL (s3://, gs://, https://, pipe:). docs/shards.md",
            allowed=choice("folder", "webdataset", "tfrecord"),
        ),
    )
    label_base: str = field(
        default="auto",
        metadata=_about(
            "shards: the label number of the first class. auto: the manifest's; without one, 1 for tfrecord (NVIDIA TF1 build_imagenet_data.py writes 1..1000 and the model subtracts 1), 0 for webdataset",
            source="TF1 build_imagenet_data.py",
        ),
    )
    index_dir: Any = field(
        default=None,
        metadata=_about(
            "tfrecord + DALI: DALI index files (NVIDIA TF1 --data_idx_dir); null: ROOT/dali_idx if it exists, else made once under shard_cache",
            source="TF1/main.py --data_idx_dir",
        ),
    )
    shard_cache: str = field(
        default=_ref("${oc.env:IMGCLS_CACHE,${oc.env:HOME,/tmp}/.cache/imgcls}/shards"),
        metadata=_about(
            "remote shards are copied here once, read locally (layout: data/shards/cache.py; `python -m imgcls.data.shards cache list|prune`)",
            allowed=folder,
        ),
    )
    batch_size: int | None = field(
        default=None, metadata=_about("PER DEVICE; null = the hardware profile's table", allowed=POSITIVE_OR_NULL)
    )
    val_batch_size: int | None = field(default=None, metadata=_about("null = batch_size", allowed=POSITIVE_OR_NULL))
    train_images: int | None = field(
        default=None,
        metadata=_about(
            "number of train images, for mode=plan's step counts (null: count data.root/train)",
            allowed=POSITIVE_OR_NULL,
        ),
    )
    num_workers: int = field(default=_ref("${hardware.num_workers}"), metadata=_about("", allowed=COUNT))
    prefetch_factor: int | None = field(
        default=_ref("${hardware.prefetch_factor}"), metadata=_about("", allowed=POSITIVE_OR_NULL)
    )
    pin_memory: bool = field(default=_ref("${hardware.pin_memory}"), metadata=_about("", allowed=boolean))
    persistent_workers: bool = field(default=True, metadata=_about("", allowed=boolean))
    image_size: int = field(
        default=_ref("${model.image_size}"), metadata=_about("train crop and val crop size", allowed=POSITIVE)
    )
    val_crop_pct: float = field(
        default=0.875,
        metadata=_about(
            "val: resize shorter side to image_size / 0.875 (256 for 224), center crop",
            allowed=number(0, 1, open_low=True),
        ),
    )
    val_crop_padding: int | None = field(
        default=None,
        metadata=_about(
            "N: resize the shorter side to image_size + N instead, then centre crop (NVIDIA's eval: PYT crop_padding 32 -> 256 for 224, 412 for B4's 380); overrides val_crop_pct",
            source="IC/dataloaders.py crop_padding",
            allowed=integer(0, null=True),
        ),
    )
    train_crop_scale: list[float] = field(
        default_factory=lambda: [0.08, 1.0],
        metadata=_about(
            "RandomResizedCrop area range (PYT: torchvision default)",
            source="IC/dataloaders.py RandomResizedCrop",
            allowed=numbers(2, 0, 1, ordered=True, open_low=True),
        ),
    )
    train_crop_ratio: list[float] = field(
        default_factory=lambda: [0.75, 1.3333333333333333],
        metadata=_about("aspect range 3/4-4/3", allowed=numbers(2, 0, ordered=True, open_low=True)),
    )
    train_crop: str = field(
        default=_ref("${oc.select:recipe.train_crop,random_resized}"),
        metadata=_about(
            "random_resized: torchvision's RandomResizedCrop (DALI: its random crop). tf: TF's sample_distorted_bounding_box (data/tf_crop.py), NVIDIA TF1/TF2",
            source="TF1/utils/image_processing.py:52-61",
            allowed=TRAIN_CROP,
        ),
    )
    train_crop_min_object_covered: float = field(
        default=0.1,
        metadata=_about(
            "train_crop=tf: the crop covers >= this of an object box (TF2 preprocessing.py:233)",
            source="TF2 preprocessing.py:233",
            allowed=number(0, 1),
        ),
    )
    train_crop_attempts: int = field(
        default=100,
        metadata=_about(
            "train_crop=tf: attempts before the whole image (TF2 preprocessing.py:236)",
            source="TF2 preprocessing.py:236",
            allowed=POSITIVE,
        ),
    )
    train_crop_object_boxes: bool = field(
        default=_ref("${oc.select:recipe.train_crop_object_boxes,false}"),
        metadata=_about(
            "train_crop=tf: the object boxes of TFRecords (image/object/bbox/*, TF1 image_processing.py:33-43); false or none: the whole image",
            source="TF1/utils/image_processing.py:33-43",
            allowed=boolean,
        ),
    )
    hflip: float = field(default=0.5, metadata=_about("horizontal flip probability", allowed=number(0, 1)))
    interpolation: Any = field(default=_ref("${recipe.interpolation}"), metadata=_about(""))
    augment: str | None = field(
        default=_ref("${recipe.augment}"),
        metadata=_about("null | autoaugment | randaugment", allowed=or_null(choice(*AUGMENTS))),
    )
    autoaugment_policy: str = field(
        default=_ref("${recipe.autoaugment_policy}"),
        metadata=_about(
            "augment=autoaugment: timm's policy name (DALI: v0 only)", allowed=choice(*AUTOAUGMENT_POLICIES)
        ),
    )
    autoaugment_ops: str = field(
        default=_ref("${oc.select:recipe.autoaugment_ops,pytorch}"),
        metadata=_about(
            "augment=autoaugment: whose Posterize, Solarize and Shear run the policy: pytorch (NVIDIA PYT autoaugment.py, PIL) | tf2 (NVIDIA TF2 augment.py as TensorFlow runs it); data/augment.py, data/dali/tf_autoaugment.py",
            source="PYT IC/autoaugment.py; TF2 dataloader/augment.py",
            allowed=choice(*AUTOAUGMENT_OPS),
        ),
    )
    randaugment: Any = field(
        default=_ref("${oc.select:recipe.randaugment,rand-m9-mstd0.5}"),
        metadata=_about("timm RandAugment policy used when augment=randaugment"),
    )
    mean: list[float] = field(
        default_factory=lambda: [0.485, 0.456, 0.406],
        metadata=_about(
            "ImageNet mean/std (NVIDIA IC/dataloaders.py, x255 there)",
            source="IC/dataloaders.py",
            allowed=numbers(3, 0, 1),
        ),
    )
    std: list[float] = field(
        default_factory=lambda: [0.229, 0.224, 0.225], metadata=_about("", allowed=numbers(3, 0, open_low=True))
    )
    num_classes: int | None = field(
        default=None, metadata=_about("null = number of class folders (synthetic: required)", allowed=POSITIVE_OR_NULL)
    )
    class_names: Any = field(
        default=None,
        metadata=_about(
            "shards without manifest.json: the names of labels 0..N-1 (else '0'..'N-1', or ImageNet's wnids for 1000 classes); a manifest's names win"
        ),
    )
    train_samples: int = field(
        default=1024, metadata=_about("data.backend=synthetic: images a training epoch has", allowed=POSITIVE)
    )
    val_samples: int = field(
        default=1024, metadata=_about("data.backend=synthetic: images a validation has", allowed=POSITIVE)
    )
    channels_last: bool = field(
        default=_ref("${model.channels_last}"),
        metadata=_about(
            "DALI writes NHWC when the model runs channels_last (NVIDIA nhwc)",
            source="PYT/main.py --memory-format nhwc",
            allowed=boolean,
        ),
    )
    dali_fp16: bool = field(
        default=False,
        metadata=_about(
            "DALI: fp16 normalized images (dali_gpu: out of CMN; dali_cpu: on the device); precision=amp or bf16 only",
            allowed=boolean,
        ),
    )
    dali_train_resize: str = field(
        default="auto",
        metadata=_about(
            "dali_cpu train resize: auto | torch | dali. torch: DALI ROI-decodes, torch resizes (DALI's CPU resize costs most of a decode; data/dali/host_resize.py). auto = torch from 128 px up, unless data.augment or the interpolation needs DALI. dali_gpu: DALI.",
            allowed=choice(*DALI_TRAIN_RESIZES),
        ),
    )
    dali_resize_threads: int = field(
        default=_ref("${.num_workers}"),
        metadata=_about(
            "threads of that torch resize (torch releases the GIL; one thread caps the rate)", allowed=COUNT
        ),
    )
    dali_host_prefetch: int = field(
        default=1,
        metadata=_about(
            "that torch resize makes batch N+1 in a background thread while step N runs; batches waiting ahead of the step (+1 in the making). 0: no thread, resize inside the step",
            allowed=COUNT,
        ),
    )
    dali_train_antialias: bool = field(
        default=False,
        metadata=_about(
            "DALI train resize antialias: false as NVIDIA (6fcd5f5d); val always antialiases (as PIL)",
            source="IC/dataloaders.py HybridTrainPipe",
            allowed=boolean,
        ),
    )
    dali_checkpointing: bool = field(
        default=True,
        metadata=_about(
            "DALI's reader checkpoint in every checkpoint: a resume continues at the saved batch. Costs a second copy of the file names per rank (+127 MiB for ImageNet's train list); false: a resume starts the reader's epoch again (docs/reliability.md)",
            allowed=boolean,
        ),
    )
    on_bad_image: str = field(
        default="skip",
        metadata=_about(
            "an undecodable file (empty, truncated, not an image): skip (one warning per file, count in report.json) | error (stop naming the file); see docs/reliability.md",
            allowed=choice(*BAD_IMAGE_POLICIES),
        ),
    )
    max_image_pixels: int = field(
        default=89478485,
        metadata=_about(
            "a larger image (width x height) is a bad image, before it is decoded: PIL's default decompression-bomb limit (a 300 KB PNG can declare 144 MP, >1 GB to decode); raise it for 108 MP photos (12000x9000) and the like",
            allowed=POSITIVE,
        ),
    )
    trace_dir: Any = field(
        default=None, metadata=_about("DALI: write each rank's sample indices per epoch here (shard checks, debugging)")
    )
    storage_options: dict[str, Any] = field(
        default_factory=dict,
        metadata=_about(
            "fsspec's options for remote shards, e.g. {endpoint_url: 'http://127.0.0.1:9000'} (docs/shards.md)"
        ),
    )
    progressive: DataProgressiveSchema = field(
        default_factory=DataProgressiveSchema,
        metadata=_about("progressive resizing: the train size grows with the epoch (data/progressive.py)"),
    )


@dataclass
class LoggerWandbSchema:
    """logger.wandb (logger=wandb)."""

    project: str = field(default="imgcls", metadata=_about("W&B project"))
    entity: str | None = field(default=None, metadata=_about("W&B entity (null: the account's default)"))
    name: str | None = field(default=None, metadata=_about("W&B run name (null: W&B's)"))
    offline: bool = field(
        default=False, metadata=_about("offline run (then `wandb sync`); also WANDB_MODE=offline", allowed=boolean)
    )
    log_model: bool = field(
        default=False, metadata=_about("upload the best checkpoint as an artifact at the end", allowed=boolean)
    )
    tags: list[str] = field(default_factory=list, metadata=_about("W&B run tags"))
    log_images: int = field(default=16, metadata=_about("training images in the sample grid (0: none)", allowed=COUNT))
    confusion_max_classes: int = field(
        default=100,
        metadata=_about("confusion matrix up to this many classes; per-class accuracy always", allowed=COUNT),
    )


@dataclass
class LoggerSchema:
    """logger: a key set to a mapping (`csv: {}`) turns its logger on; null, the default, leaves it off."""

    csv: dict[str, Any] | None = field(default=None, metadata=_about("{}: CSV metrics in the run dir"))
    tensorboard: dict[str, Any] | None = field(default=None, metadata=_about("{}: TensorBoard events in the run dir"))
    wandb: LoggerWandbSchema | None = field(default=None, metadata=_about("Weights & Biases settings"))


@dataclass
class CallbacksCheckpointSchema:
    """callbacks.checkpoint."""

    monitor: str | None = field(
        default=None,
        metadata=_about(
            "best.ckpt keeps the best value of this validation metric (a loss: its minimum); null: no best.ckpt",
            allowed=or_null(choice(*VALIDATION_METRICS)),
        ),
    )
    every_n_train_steps: int | None = field(
        default=None,
        metadata=_about("also save last.ckpt every K optimizer steps (mid-epoch resume)", allowed=POSITIVE_OR_NULL),
    )
    every_n_epochs: int | None = field(default=None, metadata=_about("", allowed=POSITIVE_OR_NULL))
    keep_epochs: int | None = field(
        default=None,
        metadata=_about(
            "also keep epoch_NNNN.ckpt of the newest N epochs, -1 all (NVIDIA --gather-checkpoints)",
            source="PYT/main.py --gather-checkpoints",
            allowed=integer(0, null=True, also=(-1,)),
        ),
    )


@dataclass
class CallbacksSchema:
    """callbacks."""

    early_stopping_patience: int | None = field(
        default=None,
        metadata=_about(
            "stop after N epochs without a better val.top1 (NVIDIA --early-stopping-patience)",
            source="PYT/main.py --early-stopping-patience",
            allowed=POSITIVE_OR_NULL,
        ),
    )
    progress_bar: str | None = field(
        default="rich",
        metadata=_about(
            "rich | tqdm | none; drawn on a terminal only (a log or a pipe gets the epoch lines)",
            allowed=or_null(choice(*PROGRESS_BARS)),
        ),
    )
    progress_bar_every_n_steps: int | None = field(
        default=10,
        metadata=_about(
            "the bar is redrawn every N batches (Lightning's default, 1, redraws every batch: host time in the step, which a GPU waits for)",
            allowed=POSITIVE_OR_NULL,
        ),
    )
    log_every_n_steps: int | None = field(
        default=20,
        metadata=_about(
            "a progress line (step, loss, LR, img/s, data time, ETA) every N optimizer steps, in every log (NVIDIA PyTorch ConvNets/configs.yml:39 convergence print_freq: 20); null: none",
            source="PYT/configs.yml:39",
            allowed=POSITIVE_OR_NULL,
        ),
    )
    charts: bool = field(
        default=True,
        metadata=_about(
            "RUN_DIR/plots/*.png at the end of fit (imgcls.plot); false: sweeps of many short jobs", allowed=boolean
        ),
    )
    count_host_syncs: bool = field(
        default=False,
        metadata=_about(
            "report.json's train/val.host_syncs_per_step on CUDA (make gpu-check; costs host time)", allowed=boolean
        ),
    )
    checkpoint: CallbacksCheckpointSchema | None = field(
        default_factory=CallbacksCheckpointSchema, metadata=_about("null: no checkpoints")
    )


@dataclass
class TrainerSchema:
    """trainer."""

    accelerator: Any = field(
        default=_ref("${hardware.accelerator}"), metadata=_about("", allowed=choice(*ACCELERATORS))
    )
    devices: Any = field(default=_ref("${hardware.devices}"), metadata=_about("", allowed=lightning_devices))
    num_nodes: int = field(default=1, metadata=_about("", allowed=POSITIVE))
    max_epochs: int = field(default=_ref("${recipe.epochs}"), metadata=_about("", allowed=STEPS_LIMIT))
    max_steps: int = field(
        default=-1,
        metadata=_about(
            "stop after N optimizer steps (-1: no limit); the LR schedule still spans recipe.epochs",
            allowed=STEPS_LIMIT,
        ),
    )
    sync_batchnorm: bool = field(
        default=False,
        metadata=_about(
            "true: timm's SyncBatchNorm conversion (keeps EfficientNet's BN+SiLU); GPUs only", allowed=boolean
        ),
    )
    gradient_clip_val: float | None = field(default=None, metadata=_about("", allowed=number(0, null=True)))
    log_every_n_steps: int = field(default=50, metadata=_about("", allowed=POSITIVE))
    limit_train_batches: Any = field(default=None, metadata=_about("", allowed=limit_batches(zero_ok=False)))
    limit_val_batches: Any = field(default=None, metadata=_about("", allowed=limit_batches(zero_ok=True)))
    check_val_every_n_epoch: int | None = field(default=1, metadata=_about("", allowed=POSITIVE_OR_NULL))
    num_sanity_val_steps: int = field(default=0, metadata=_about("", allowed=integer(0, also=(-1,))))
    enable_progress_bar: bool = field(default=True, metadata=_about("", allowed=boolean))
    enable_model_summary: bool = field(default=True, metadata=_about("", allowed=boolean))
    strategy: str = field(
        default="auto",
        metadata=_about("auto: ddp when devices x nodes > 1 (find_unused_parameters off)", allowed=choice(*STRATEGIES)),
    )
    min_epochs: int | None = field(default=None, metadata=_about("", allowed=integer(0, null=True)))
    min_steps: int | None = field(default=None, metadata=_about("", allowed=integer(0, null=True)))
    max_time: Any = field(default=None, metadata=_about(""))
    gradient_clip_algorithm: Any = field(default=None, metadata=_about(""))
    limit_test_batches: Any = field(default=None, metadata=_about("", allowed=limit_batches(zero_ok=True)))
    limit_predict_batches: Any = field(default=None, metadata=_about("", allowed=limit_batches(zero_ok=True)))
    # Lightning: an int counts batches, a float is a fraction (typed float, 2 would become 2.0: a fraction)
    overfit_batches: Any = field(default=0.0, metadata=_about("", allowed=number(0)))
    # Lightning: an int counts batches, a float is a fraction (typed float, 2 would become 2.0: a fraction)
    val_check_interval: Any = field(default=None, metadata=_about("", allowed=number(0, open_low=True, null=True)))
    fast_dev_run: Any = field(default=False, metadata=_about(""))
    benchmark: Any = field(default=None, metadata=_about(""))
    inference_mode: bool = field(default=True, metadata=_about("", allowed=boolean))
    profiler: Any = field(default=None, metadata=_about(""))
    detect_anomaly: bool = field(default=False, metadata=_about("", allowed=boolean))
    barebones: Any = field(default=False, metadata=_about("", allowed=not_barebones))
    reload_dataloaders_every_n_epochs: int = field(default=0, metadata=_about("", allowed=COUNT))
    enable_autolog_hparams: bool = field(default=True, metadata=_about("", allowed=boolean))
    model_registry: Any = field(default=None, metadata=_about(""))


# Group -> its schema (train.yaml's order; "" is train.yaml's own keys).
GROUPS: dict[str, type] = {
    "": TrainSchema,
    "model": ModelSchema,
    "precision": PrecisionSchema,
    "hardware": HardwareSchema,
    "recipe": RecipeSchema,
    "data": DataSchema,
    "logger": LoggerSchema,
    "callbacks": CallbacksSchema,
    "trainer": TrainerSchema,
}


def keys(schema: type, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> its dataclass field, every leaf and nested block of a schema (a nested block's own key too)."""
    found: dict[str, Any] = {}
    for f in fields(schema):
        found[prefix + f.name] = f
        nested = _nested(f)
        if nested is not None:
            found.update(keys(nested, f"{prefix}{f.name}."))
    return found


def _nested(f: Any) -> type | None:
    """The dataclass of a nested block (its default factory makes one, or its type names one of this module)."""
    if f.default_factory is not _NO_DEFAULT and is_dataclass(f.default_factory):
        return f.default_factory
    name = str(f.type).removesuffix(" | None")
    found = globals().get(name)
    return found if isinstance(found, type) and is_dataclass(found) else None


def defaults(group: str) -> dict[str, Any]:
    """The schema's default of every key of a group that has one (not MISSING): what a checkpoint written before a
    key existed gets for it."""
    values = OmegaConf.to_container(OmegaConf.structured(GROUPS[group]))
    assert isinstance(values, dict)
    return {str(k): v for k, v in values.items() if v != MISSING}


def base(group: str) -> DictConfig:
    """The group's schema as the config node its options extend (GROUP/_schema), typed, and not struct: a key the
    schema lacks composes, so that config.checks refuses it in one line naming the file that wrote it and the key
    meant (Hydra would stop at the first with a traceback-style message). The command line's `GROUP.KEY=` of such
    a key is refused before (config.overrides)."""
    node = OmegaConf.structured(GROUPS[group])
    _not_struct(node)
    return node


def _not_struct(node: DictConfig) -> None:
    # On every block, a null one too (precision.loss_scale, recipe.qat, logger.wandb): OmegaConf refuses a key a
    # dataclass lacks unless the block's own flag says not struct (its parent's does not count), and a block a YAML
    # file fills in keeps the flag of the null node it fills.
    OmegaConf.set_struct(node, False)
    if not node._is_none():
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig):
                _not_struct(child)


def register() -> None:
    """GROUP/_schema in Hydra's ConfigStore: the base a group option names first in its defaults list."""
    store = ConfigStore.instance()
    for group in GROUPS:
        if group:
            store.store(group=group, name="_schema", node=base(group))
