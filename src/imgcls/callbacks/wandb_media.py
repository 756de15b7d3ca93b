"""What a W&B dashboard shows beyond scalars (metrics, LR, img/s and the resolved config already reach
every logger): a grid of training images as the model sees them (after augmentation), and at the end
per-class val accuracy plus a confusion matrix.

The per-class numbers come from the last validation: the predictions the module's validation_step returns
(the network's one pass over each val batch, under the run's precision), so the network never runs twice. The
confusion matrix is a torchmetrics metric, summed over ranks like the module's val metrics, so it is
exact under DDP (each rank's val part unpadded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from torchmetrics.classification import MulticlassConfusionMatrix
from torchvision.utils import make_grid

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema, LoggerSchema


class WandbMedia(L.Callback):
    def __init__(
        self,
        classes: list[str],
        mean: list[float],
        std: list[float],
        images: int = 16,
        confusion_max_classes: int = 100,
    ) -> None:
        self.classes = list(classes)
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)
        self.images = int(images)
        self.confusion_max_classes = int(confusion_max_classes)
        self.confusion = MulticlassConfusionMatrix(len(self.classes))
        self._logged_images = False

    @staticmethod
    def _wandb(trainer: L.Trainer) -> WandbLogger | None:
        return next((lg for lg in trainer.loggers if isinstance(lg, WandbLogger)), None)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        logger = self._wandb(trainer)
        if self._logged_images or not self.images or logger is None or not trainer.is_global_zero:
            return
        self._logged_images = True
        images, labels = batch[0][: self.images].detach().cpu(), batch[1][: self.images].cpu()
        grid = make_grid(self.as_shown(images), nrow=min(8, len(images)), padding=2)
        caption = " ".join(self.classes[int(k)] for k in labels)
        # HWC uint8: wandb stores a float array's values as they are (a [0, 1] grid became a black PNG).
        logger.log_image("train.samples", [grid.permute(1, 2, 0).numpy()], step=trainer.global_step, caption=[caption])

    def as_shown(self, images: torch.Tensor) -> torch.Tensor:
        """A batch as the network sees it (normalized floats, or uint8 where a loader normalizes later) -> the
        uint8 pixels of the augmented images."""
        if images.dtype != torch.uint8:
            images = (images.float() * self.std + self.mean).clamp(0, 1)  # undo the loader's normalization
            images = (images * 255).round().to(torch.uint8)
        return images

    def _final_validation(self, trainer: L.Trainer) -> bool:
        last = trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs - 1
        return last and not trainer.sanity_checking and self._wandb(trainer) is not None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.confusion = self.confusion.to(pl_module.device)
        self.confusion.reset()

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if self._final_validation(trainer):
            self.confusion.update(outputs["preds"], batch[1])

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._final_validation(trainer):
            return
        matrix = self.confusion.compute().cpu()  # a collective under DDP: every rank calls it
        logger = self._wandb(trainer)
        if not trainer.is_global_zero or logger is None:
            return
        counts = matrix.sum(1)
        rows = [
            [name, 100.0 * float(matrix[k, k]) / max(int(counts[k]), 1), int(counts[k])]
            for k, name in enumerate(self.classes)
        ]
        logger.log_table("val.per_class", columns=["class", "val.top1", "images"], data=rows, step=trainer.global_step)
        if len(self.classes) <= self.confusion_max_classes:  # a C x C chart is unreadable beyond that
            import wandb

            # W&B's chart takes per-sample labels: expand the summed matrix back into (actual, predicted) pairs.
            pairs = [(i, j) for (i, j), n in zip(torch.cartesian_prod(*[torch.arange(len(counts))] * 2).tolist(),
                                                 matrix.flatten().tolist()) for _ in range(n)]  # fmt: skip
            actual, predicted = [i for i, _ in pairs], [j for _, j in pairs]
            chart = wandb.plot.confusion_matrix(y_true=actual, preds=predicted, class_names=self.classes)
            logger.experiment.log({"val.confusion_matrix": chart})


def wandb_media_callbacks(logger: LoggerSchema, data: DataSchema, classes: list[str]) -> list[L.Callback]:
    """[WandbMedia] when logger=wandb, else []: the media need a W&B run to go to."""
    if logger.wandb is None:
        return []
    images, max_classes = logger.wandb.log_images, logger.wandb.confusion_max_classes
    return [WandbMedia(classes, list(data.mean), list(data.std), images, max_classes)]
