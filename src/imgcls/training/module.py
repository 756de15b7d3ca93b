"""The LightningModule: network, loss, mixup, EMA, metrics, optimizer and LR schedule.

It never knows which data backend feeds it: batches are (float images NCHW, int64 labels).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from timm.data.mixup import mixup_target
from timm.loss import SoftTargetCrossEntropy
from torch import nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy

from imgcls.config import schema
from imgcls.config.schema import ModelSchema, RecipeSchema
from imgcls.models import build_network
from imgcls.training.ema import ModelEma
from imgcls.training.mixup import DeviceMixup
from imgcls.training.optimizer import build_optimizer, parameter_groups
from imgcls.training.scheduler import recipe_scheduler
from imgcls.typed_config import settings


class ClassificationModule(L.LightningModule):
    def __init__(
        self,
        model: dict[str, Any],
        recipe: dict[str, Any],
        plan: dict[str, Any],
        classes: list[str],
        run_config: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        # The checkpoint carries everything evaluation needs: model/recipe config, classes, plan and
        # the whole resolved run config.
        self.save_hyperparameters()
        # A checkpoint written before a key existed lacks it: the schema's default, as a composed config has it.
        self.model_cfg: ModelSchema = settings(ModelSchema, model)
        self.recipe: RecipeSchema = settings(RecipeSchema, recipe)
        if "weight_decay_on" not in recipe:  # a checkpoint from before the key: its boolean said the same
            old = recipe.get("norm_bias_weight_decay")
            self.recipe.weight_decay_on = "all" if old else "conv_and_linear_weights"
        self.plan = plan
        self.classes = list(classes)
        num_classes = len(self.classes)
        self.net = build_network(self.model_cfg, num_classes)
        self.channels_last = bool(self.model_cfg.channels_last)
        if self.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)

        self._calibration: Callable[[], Iterable[torch.Tensor]] | None = None  # quantize_at_setup
        self._compile_after_quantization = False
        self.mixup = _build_mixup(self.recipe, num_classes)
        self.mixup_dropped_samples = 0  # since this process started; see _mix
        self.mixup_unmixed_batches = 0
        smoothing = float(self.recipe.label_smoothing)
        # With mixup the smoothing is folded into the soft targets by timm's Mixup.
        self.train_criterion = (
            SoftTargetCrossEntropy() if self.mixup else nn.CrossEntropyLoss(label_smoothing=smoothing)
        )
        # val.loss: plain CE, per sample, so that its mean needs no weights (below). With label smoothing,
        # val.loss_smoothed too: NVIDIA PyTorch validates with its training criterion (PYT/main.py:453-457), which
        # is LabelSmoothing (PYT/image_classification/smoothing.py:33-40) in the recipes without mixup, so its
        # val.loss is val.loss_smoothed there (90e, 50e); with mixup NLLMultiLabelSmooth's eval branch is plain
        # cross_entropy (PYT/image_classification/mixup.py:54-69): val.loss (250e, efficientnet).
        self.val_criterion = nn.CrossEntropyLoss(reduction="none")
        self.val_smoothed_criterion = (
            nn.CrossEntropyLoss(reduction="none", label_smoothing=smoothing) if smoothing > 0 else None
        )

        # timm's EMA (not Lightning's EMAWeightAveraging) so that validation can report raw and EMA
        # weights side by side, as NVIDIA's val_ema.* does. Updated once per optimizer step.
        ema_decay = self.recipe.ema_decay
        # NVIDIA's ramp min(decay, (1 + t) / (10 + t)), t counted as recipe.ema_ramp's framework counts it (ema.py).
        self._ema_ramp = str(self.recipe.ema_ramp) if self.recipe.ema_dynamic_decay else None
        self.ema = self._averaged(float(ema_decay)) if ema_decay else None
        self._ema_step = -1  # the global_step of the EMA's last update (on_train_start, on_train_batch_end)

        top5 = min(5, num_classes)
        self.val_metrics = nn.ModuleDict()
        for prefix in ("val", "val_ema") if self.ema else ("val",):
            metrics: dict[str, Metric] = {
                "top1": MulticlassAccuracy(num_classes, top_k=1, average="micro"),
                "top5": MulticlassAccuracy(num_classes, top_k=top5, average="micro"),
                # Each sample's loss at weight 1: MeanMetric made a device tensor of a host weight and, unless
                # nan_strategy="disable", checked the values for NaN with .any(): 3 host syncs a batch. A NaN or
                # Inf loss is then in val.loss, not dropped from it with a warning.
                "loss": MeanMetric(nan_strategy="disable"),
            }
            if self.val_smoothed_criterion is not None:
                metrics["loss_smoothed"] = MeanMetric(nan_strategy="disable")
            self.val_metrics[prefix] = nn.ModuleDict(metrics)

    def compile_network(self) -> None:
        """`compile=true` for training and its benchmark alike: torch.compile in place (nn.Module.compile), so
        checkpoint keys stay `net.*` (torch.compile's wrapper would add `_orig_mod.`). The EMA copy runs in
        validation only and stays eager. A network still to be quantized is compiled after that (configure_model)."""
        if self._calibration is not None:
            self._compile_after_quantization = True
            return
        self.net.compile()

    def quantize_at_setup(self, calibration: Callable[[], Iterable[torch.Tensor]]) -> None:
        """recipe=qat: quantize the network in configure_model, with the batches `calibration()` gives then. Lightning
        runs that hook once the process group exists and this rank's GPU is current, and before a checkpoint is
        restored (its quantizer ranges need the quantizers) and before DDP wraps the network: so one rank lists the
        training split for all (data/file_list.py, made_once) and no rank makes a CUDA context on another's GPU."""
        self._calibration = calibration

    def configure_model(self) -> None:
        if self._calibration is not None:
            calibration, self._calibration = self._calibration, None
            self.quantize_network(calibration())
            if self._compile_after_quantization:
                self.net.compile()

    def quantize_network(self, batches: Any) -> None:
        """recipe=qat: fake INT8 quantizers in the network, calibrated on `batches` (quantization/qat.py). The
        EMA copy, if any, is taken again so that it has them too."""
        from imgcls.quantization import qat

        quantization = self.recipe.qat  # a QAT recipe's (conf/recipe/qat.yaml); only train.py calls this, with it
        if quantization is None:
            raise RuntimeError("quantize_network needs a QAT recipe (recipe.qat)")
        self.net = qat.quantize(
            self.net, batches, qat.calibration_device(), calibrator=quantization.calibrator,
            percentile=float(quantization.percentile), quantizers=quantization.quantizers,
        )  # fmt: skip
        if self.ema is not None:
            self.ema = self._averaged(self.ema.decay)

    def _averaged(self, decay: float) -> ModelEma:
        """timm's EMA copy of the network (ema.py), frozen: ModelEmaV3 (unlike timm's ModelEma) leaves its
        parameters requiring grad, and DDP then waits for their gradients at every step ("parameters that were not
        used in producing the loss": every EMA run on 2+ devices died at its second step). Frozen, they stay out of
        DDP's buckets; the optimizer takes self.net's parameters only."""
        ema = ModelEma(self.net, decay=decay, ramp=self._ema_ramp)
        ema.requires_grad_(False)
        return ema

    def on_fit_start(self) -> None:
        # timm keeps the EMA copy in eval mode; Lightning would warn that ~100 modules are in eval mode at the
        # start of training. The copy only runs in validation, where Lightning puts every module in eval mode,
        # and its update copies weights whatever the mode, so it follows the module's mode like the rest.
        if self.ema is not None:
            self.ema.module.train(self.training)

    def on_train_start(self) -> None:
        # Both networks are on their device and a resumed run's weights restored (in place): the EMA's update
        # lists can be built now, once (ema.py).
        if self.ema is not None:
            self.ema.track(self.net)
            # The optimizer step the EMA last took in: a resumed run has taken its global_step already, so a first
            # micro-batch that steps no optimizer (gradient accumulation) does not average the same weights twice.
            self._ema_step = self.global_step

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning sets _current_fx_name before and after every hook it calls, dozens of times a step, each time
        # through nn.Module.__setattr__'s parameter, buffer and module checks; a string is none of those, so it is
        # stored as Python stores any attribute (what that path ends in). docs/benchmarks.md has the calls saved.
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        images, labels = batch
        targets: torch.Tensor = labels
        if self.mixup is not None:
            images, labels, targets = self._mix(images, labels)
        loss = self.train_criterion(self(images), targets)
        # Not prog_bar: Lightning turns progress-bar metrics into Python numbers every batch (a host sync per
        # step on a GPU). Logged only on the steps Lightning writes to the loggers (trainer.log_every_n_steps):
        # self.log is the costliest host work of the step (docs/benchmarks.md), and other steps' values go unread.
        # report.json and the NaN check take every step's loss from the returned dict.
        if self._logs_this_step():
            self.log("train.loss", loss, on_step=True, on_epoch=False, batch_size=len(labels))
        return {"loss": loss, "loss_value": loss.detach()}

    def _logs_this_step(self) -> bool:
        trainer = self._trainer
        if trainer is None:
            return True
        # fast_dev_run: set on the Trainer by Lightning's debugging connector, not declared on the class.
        fast_dev_run = trainer.fast_dev_run  # type: ignore[attr-defined]
        return trainer._logger_connector.should_update_logs or bool(fast_dev_run)

    def _mix(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """timm's Mixup pairs each sample with its mirror in the batch and asserts an even size, which a
        skipped bad file breaks. An odd batch drops its last sample rather than being refilled (the module
        does not own the loader) or skipped (a rank without a backward pass would stall DDP's all-reduce).
        One sample cannot be mixed: it trains on its smoothed label alone. Both are counted for report.json
        (callbacks/bad_image_report.py)."""
        mixup = self.mixup
        assert mixup is not None  # training_step mixes only with mixup or CutMix on
        if len(labels) == 1:
            self.mixup_unmixed_batches += 1
            return images, labels, mixup_target(labels, mixup.num_classes, 1.0, mixup.label_smoothing)
        if len(labels) % 2:
            self.mixup_dropped_samples += 1
            images, labels = images[:-1], labels[:-1]
        images, targets = mixup(images, labels)
        return images, labels, targets

    def mixup_counts(self) -> dict[str, int]:
        """Samples _mix dropped and batches it left unmixed in this process (callbacks/bad_image_report.py)."""
        return {
            "mixup_dropped_samples": self.mixup_dropped_samples,
            "mixup_unmixed_batches": self.mixup_unmixed_batches,
        }

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Lightning increments global_step only on real optimizer steps: update EMA then, not on
        # every micro-batch (an NVIDIA quirk not copied).
        if self.ema is not None and self.global_step != self._ema_step:
            self._ema_step = self.global_step
            self.ema.update(self.net, step=self.global_step)
        # Only on the steps Lightning writes to the loggers (as its LearningRateMonitor does): self.log makes
        # a device tensor of a float, a host-to-device copy that waits for the GPU's queue.
        if self._logs_this_step():
            optimizer = self.trainer.optimizers[0]
            self.log("train.lr", optimizer.param_groups[-1]["lr"], on_step=True, on_epoch=False)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        images, labels = batch
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        logits = self.net(images)
        self._update_metrics("val", logits, labels)
        if self.ema is not None:
            self._update_metrics("val_ema", self.ema.module(images), labels)
        # For callbacks (on_validation_batch_end's `outputs`, e.g. W&B per-class accuracy): the predictions of
        # this pass, under the run's precision, so that no callback runs the network again.
        return {"preds": logits.argmax(1)}

    def _update_metrics(self, prefix: str, logits: torch.Tensor, labels: torch.Tensor) -> None:
        metrics = self._metrics(prefix)
        metrics["top1"].update(logits, labels)
        metrics["top5"].update(logits, labels)
        metrics["loss"].update(self.val_criterion(logits.float(), labels))
        if self.val_smoothed_criterion is not None:
            metrics["loss_smoothed"].update(self.val_smoothed_criterion(logits.float(), labels))

    def _metrics(self, prefix: str) -> dict[str, Metric]:
        """The val metrics of `prefix` (built in __init__); nn.ModuleDict types its values as any nn.Module."""
        group = self.val_metrics[prefix]
        assert isinstance(group, nn.ModuleDict)
        return {name: cast(Metric, metric) for name, metric in group.items()}

    def on_validation_epoch_end(self) -> None:
        # Percentages (0-100) like NVIDIA; torchmetrics sums counts over ranks, so the result is the
        # same for any number of processes as long as each sample is seen exactly once.
        for name in self.val_metrics:
            metrics = self._metrics(name)
            self.log(f"{name}.top1", metrics["top1"].compute() * 100, prog_bar=name == "val")
            self.log(f"{name}.top5", metrics["top5"].compute() * 100)
            self.log(f"{name}.loss", metrics["loss"].compute())
            if "loss_smoothed" in metrics:
                self.log(f"{name}.loss_smoothed", metrics["loss_smoothed"].compute())
            for metric in metrics.values():
                metric.reset()

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        groups = parameter_groups(self.net, self.plan["weight_decay"], self.recipe.weight_decay_on)
        clipping = bool(self.trainer.gradient_clip_val)  # Lightning refuses fused optimizers with clipping
        optimizer = build_optimizer(groups, self.recipe, self.plan["lr"], fused=not clipping)
        scheduler = recipe_scheduler(optimizer, self.trainer, self.recipe)
        # Lightning types the scheduler as torch's, yet steps any other through lr_scheduler_step (timm's, below).
        lr_scheduler = {"scheduler": scheduler, "interval": "step"}
        return {"optimizer": optimizer, "lr_scheduler": lr_scheduler}  # type: ignore[typeddict-item]

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        # timm schedulers are stepped with the optimizer-step count (Lightning needs this override).
        scheduler.step_update(num_updates=self.global_step)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["imgcls"] = {
            "arch": self.model_cfg.arch,
            "model": self.model_cfg.name,
            "classes": self.classes,
            "image_size": int(self.model_cfg.image_size),
            "has_ema": self.ema is not None,
        }
        from imgcls.quantization import qat

        if qat.is_quantized(self.net):  # what inference/trained.py rebuilds before it loads the weights
            checkpoint[qat.STATE_KEY] = qat.quantizer_state(self.net)


# The schema's defaults (config/schema.py): what a checkpoint written before a key existed gets for it (the module
# merges its stored keys onto the schema); a required key has none.
MODEL_DEFAULTS: dict[str, Any] = schema.defaults("model")
RECIPE_DEFAULTS: dict[str, Any] = schema.defaults("recipe")


def _build_mixup(recipe: RecipeSchema, num_classes: int) -> DeviceMixup | None:
    mixup, cutmix = float(recipe.mixup), float(recipe.cutmix)
    if not (mixup or cutmix):
        return None
    # Partner = the flipped batch; recipe.mixup_mode: one lambda per batch (NVIDIA PyTorch) or per sample
    # (NVIDIA TF1 and TF2), timm's "batch" / "elem"; smoothing on the targets. timm's "elem" waits for the GPU at
    # every step (mixup.py): DeviceMixup draws and mixes per sample on the device, and is timm's otherwise.
    mode = str(recipe.mixup_mode)
    return DeviceMixup(
        mixup_alpha=mixup,
        cutmix_alpha=cutmix,
        label_smoothing=float(recipe.label_smoothing),
        num_classes=num_classes,
        mode=mode,
    )
