"""Synthetic data for throughput runs (NVIDIA --data-backend synthetic): one batch made on the training device once
and handed out every step, as NVIDIA's SyntheticDataLoader (image_classification/dataloaders.py) does.

Drawing samples in loader workers and copying them to the GPU measured the host (on one H200 resnet50 AMP's
`mode=benchmark` read 0.6x its own compute): a synthetic run measures the network and the training loop only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from imgcls.data.bad_images import BadImageLog
from imgcls.data.protocol import LoaderSpec

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema


class SyntheticBatches:
    """`steps` batches a pass, all the same tensors: normal images (already "normalized", float32, channels_last when
    the network runs it) and uniform labels, made with a generator of their own (the run's RNG streams are not
    touched) on `device` at the first iteration. A fresh pair per split (the backend builds one loader a split).

    Stateful like the other train loaders (Lightning saves its position in a checkpoint): a resumed epoch hands
    out only the steps it had left. The batch is the same object each step: a step that mixes its batch in place
    (timm's Mixup does) mixes the mixed batch again, which keeps it a finite convex combination of normals."""

    def __init__(
        self,
        steps: int,
        batch_size: int,
        image_size: int,
        num_classes: int,
        seed: int,
        channels_last: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        self.steps = steps
        self.batch_size = batch_size
        self.image_size = image_size
        self.num_classes = num_classes
        self.seed = seed
        self.channels_last = channels_last
        self.device = torch.device(device or "cpu")
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None
        self._skip = 0  # steps of the current pass already taken (a resumed epoch)
        self._taken = 0

    def __len__(self) -> int:
        return self.steps

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._batch is None:
            generator = torch.Generator(device=self.device).manual_seed(self.seed)
            shape = (self.batch_size, 3, self.image_size, self.image_size)
            images = torch.randn(shape, generator=generator, device=self.device)
            if self.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            labels = torch.randint(self.num_classes, (self.batch_size,), generator=generator, device=self.device)
            self._batch = (images, labels)
        return self._batch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batch = self.batch()
        self._taken, self._skip = self._skip, 0
        while self._taken < self.steps:
            self._taken += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"consumed_steps": self._taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        taken = int(state.get("consumed_steps", 0))
        self._skip = taken if taken < self.steps else 0  # an epoch saved at its end: the next starts whole


class SyntheticBackend:
    """data.backend=synthetic: SyntheticBatches for each split and rank, no input pipeline (NVIDIA --data-backend
    synthetic)."""

    def __init__(self, cfg: DataSchema) -> None:
        self.cfg = cfg
        assert cfg.num_classes is not None, "config.checks refuses data.backend=synthetic without data.num_classes"
        self.classes = [str(i) for i in range(cfg.num_classes)]
        self.bad_images = BadImageLog("skip")  # generated tensors: never a bad file, but the same interface

    def loader(self, spec: LoaderSpec) -> SyntheticBatches:
        # Progressive resizing does not apply: synthetic images keep the model's size.
        training = spec.split == "train"
        count = self.cfg.train_samples if training else self.cfg.val_samples
        per_rank = count // spec.world_size
        steps = per_rank // spec.batch_size if training else -(-per_rank // spec.batch_size)  # train: no partial
        return SyntheticBatches(
            max(steps, 1), spec.batch_size, int(self.cfg.image_size), len(self.classes),
            seed=spec.seed * 1_000_003 + 2 * spec.rank + (0 if training else 1),  # a fresh batch per split and rank
            channels_last=self.cfg.channels_last, device=spec.device,
        )  # fmt: skip

    def on_device(self, batch: Any) -> Any:
        return batch  # made normalized on the device
