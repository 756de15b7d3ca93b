"""The names a config value chooses from where the code behind them needs torch, timm or Lightning (conv inits,
optimizers, LR schedules, the Trainer arguments imgcls sets). Kept here, free of those imports, so that
config/checks.py and config/overrides.py (and with them a command that only reports a bad value) do not import
torch, timm and Lightning first (~6 s of CPU per command)."""

from __future__ import annotations

# NVIDIA's legacy `main.py --model-config/-c` names for the conv init (resnet.py resnet_configs before commit
# f217ab11): classic and grp-fanout initialise with fan_out, fanin and grp-fanin with fan_in.
CONV_INIT_ALIASES = {"classic": "fan_out", "fanin": "fan_in", "grp-fanin": "fan_in", "grp-fanout": "fan_out"}
# TensorFlow's initializers, for the TF seeds' experiments: tf1 = TF1 ConvNets `--weight_init=fan_in` (every TF1
# training script), tf2 = TF2 EfficientNet v1 (cfg weight_init fan_out); see models/factory.py init_tensorflow.
TF_INITS = ("tf1", "tf2")
CONV_INITS = ("fan_in", "fan_out", *CONV_INIT_ALIASES, *TF_INITS)

OPTIMIZERS = ("sgd", "rmsprop", "rmsprop_tf")  # optimizer.py build_optimizer
SCHEDULES = ("cosine", "linear", "step", "cosine_tf1", "exponential")  # scheduler.py build_scheduler
# Which parameters get weight decay (optimizer.py parameter_groups): recipe.weight_decay_on.
WEIGHT_DECAY_SETS = ("conv_and_linear_weights", "all_but_norm", "all_but_norm_and_depthwise", "all")
# timm AutoAugment policies (recipe.autoaugment_policy). v0 is the list of NVIDIA's PyTorch IC/autoaugment.py,
# TF2 dataloader/augment.py policy_v0 and DALI's image_net policy; original is the AutoAugment paper's table.
AUTOAUGMENT_POLICIES = ("v0", "v0r", "original", "originalr")
# Whose AutoAugment ops run the policy (recipe.autoaugment_ops, data/augment.py, data/dali/tf_autoaugment.py): NVIDIA
# PyTorch's image_classification/autoaugment.py (PIL), or NVIDIA TF2's dataloader/augment.py as TensorFlow runs it.
AUTOAUGMENT_OPS = ("pytorch", "tf2")
# model.drop_path_mask (models/stochastic_depth.py): timm's per-sample DropPath (TF2), or NVIDIA PyTorch's one mask
# per batch.
DROP_PATH_MASKS = ("sample", "batch")
LR_INTERVALS = ("step", "epoch")  # recipe.lr_interval (scheduler.py): every optimizer step, or NVIDIA's per epoch
# recipe.qat.quantizers (quantization/placement.py): modelopt's INT8 default (conv/linear/pool inputs and weights), or
# NVIDIA's extra ones too.
QUANTIZER_SETS = ("conv_linear", "nvidia")
CALIBRATORS = ("max", "percentile")  # recipe.qat.calibrator (quantization/qat.py)
AUGMENTS = ("autoaugment", "randaugment")  # recipe.augment / data.augment (null: none): data/augment.py, DALI's
DALI_TRAIN_RESIZES = ("auto", "torch", "dali")  # data.dali_train_resize: data/dali/host_resize.py resize_on_host
HOST_RESIZE_MODES = ("bilinear", "bicubic", "nearest")  # the interpolations that torch resize has (host_resize.py)
EXPORT_FORMATS = ("weights", "onnx", "torchscript", "int8", "triton")  # export's format= (imgcls.export FORMATS)
BAD_IMAGE_POLICIES = ("skip", "error")  # data.on_bad_image: data/bad_images.py
PROGRESS_BARS = ("rich", "tqdm", "none")  # callbacks.progress_bar (null: none): callbacks/console.py
# timm Mixup modes (recipe.mixup_mode): one lambda per batch, per pair of samples, or per sample.
MIXUP_MODES = ("batch", "pair", "elem")
DATA_BACKENDS = ("torchvision", "synthetic", "dali_cpu", "dali_gpu")  # data.backend: data/backends.py BACKENDS
# trainer.accelerator: the devices imgcls trains and evaluates on (auto: Lightning picks, evaluate's default).
ACCELERATORS = ("gpu", "cuda", "cpu", "auto")
# trainer.strategy: DDP as Lightning runs it (auto: ddp for more than one process, run/trainer.py); imgcls's
# checkpoints, EMA, samplers and loss scaling are built and tested for these.
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true")
# What validation logs (training/module.py validation_step, on_validation_epoch_end): callbacks.checkpoint.monitor.
# val_ema.* with recipe.ema_decay, *.loss_smoothed with label smoothing; a loss is kept at its minimum.
VALIDATION_METRICS = tuple(
    f"{prefix}.{name}" for prefix in ("val", "val_ema") for name in ("top1", "top5", "loss", "loss_smoothed")
)
# lightning.Trainer arguments that imgcls derives from other keys (conf/trainer/default.yaml lists the rest): what
# to set instead. run/trainer.py refuses them in the config; config/overrides.py on the command line, before torch
# loads.
IMGCLS_TRAINER_ARGS = {
    "precision": "precision=amp|bf16|tf32|fp32", "accumulate_grad_batches": "recipe.global_batch_size",
    "callbacks": "callbacks.*", "logger": "logger=...", "plugins": "precision/hardware", "deterministic":
    "deterministic=true", "enable_checkpointing": "callbacks.checkpoint", "use_distributed_sampler": None,
    "default_root_dir": "hydra.run.dir",
}  # fmt: skip
