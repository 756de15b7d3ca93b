"""What the DataModule needs of a data backend and of its loaders, whichever backend runs.

A backend (torchvision/, dali/, synthetic.py; chosen in backends.py) turns one LoaderSpec into a loader for one
rank and says how a batch becomes the model's input once on the device. A train loader is resumable and owns its
state: state_dict() is what a checkpoint keeps (gathered over the ranks by the loader itself where the ranks'
states differ), and the backend takes that state back at construction (LoaderSpec.resume), where a loader that
must be built at its position (a DALI pipeline from its reader checkpoint) can use it without building twice.
Lightning calls load_state_dict() on a stateful train loader too (fit loop "combined_loader"), with the same state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from imgcls.data.bad_images import BadImageLog


@dataclass(frozen=True)
class LoaderSpec:
    """One rank's loader of one split. Equal specs make the same loader (the DataModule keeps one per spec);
    `resume` is not part of that equality: it says where the loader starts, not what it produces."""

    split: str  # "train" or "val"
    batch_size: int  # per device
    rank: int = 0
    world_size: int = 1
    seed: int = 0  # the run's seed (seeding.py derives every stream from it)
    image_size: int | None = None  # None: data.image_size (progressive resizing sets a stage's size)
    augment_magnitude: int | None = None  # None: the config's RandAugment magnitude (progressive augmentation)
    # The epoch the loader's first pass is (a progressive stage's first epoch): a backend that seeds per loader
    # (DALI) seeds from it, so that a later stage does not replay epoch 0's order; one that seeds per epoch ignores it.
    first_epoch: int = 0
    device: torch.device | None = None  # the training device (None outside a fit: evaluate's own loop, tests)
    # The trainer's limit_train_batches (an int: at most that many steps an epoch; a float: that fraction of
    # len()): a loader whose state must say whether its epoch has ended reads it (DALI).
    limit_batches: int | float = 1.0
    # A saved state_dict() of this backend's train loader (all ranks' parts already in it), to start from;
    # None: a fresh start. The backend decides what of it applies (another world size, another image size).
    resume: Any = field(default=None, compare=False)


class ResumableLoader(Protocol):
    """A loader Lightning iterates once per epoch and resumes mid-epoch ("stateful" to Lightning)."""

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class DataBackend(Protocol):
    """A source of loaders: its classes, its record of skipped files, and one loader per LoaderSpec."""

    classes: list[str]
    bad_images: BadImageLog

    def loader(self, spec: LoaderSpec) -> ResumableLoader: ...

    def on_device(self, batch: Any) -> Any:
        """The batch, on its training device, as the model takes it (e.g. uint8 images made normalized float)."""
        ...
