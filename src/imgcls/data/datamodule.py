"""The LightningDataModule: one interface over every data backend (data/protocol.py).

It asks the backend for a loader per LoaderSpec and keeps it, runs the progressive-resizing stages, and carries
the train loader's own state through checkpoints. Nothing here depends on which backend runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning as L
import torch

from imgcls.data.backends import make_backend
from imgcls.data.bad_images import BadImageLog, set_max_pixels
from imgcls.data.demo import ensure_demo_dataset
from imgcls.data.progressive import ProgressiveSchedule, schedule_from_config
from imgcls.data.protocol import LoaderSpec

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema


class ClassificationDataModule(L.LightningDataModule):
    """Builds the backend at construction (so the class list is known before the model is built)."""

    def __init__(self, cfg: DataSchema, batch_size: int, seed: int = 0) -> None:
        super().__init__()
        if cfg.name == "demo":
            ensure_demo_dataset(cfg.root)
        self.cfg = cfg
        set_max_pixels(cfg.max_image_pixels)  # before a loader (and its forked workers) exists
        self.batch_size = batch_size
        self.val_batch_size = int(cfg.val_batch_size or batch_size)
        self.seed = seed
        self.backend = make_backend(cfg)
        self.schedule: ProgressiveSchedule | None = schedule_from_config(cfg)
        # Loaders are kept between epochs (persistent workers, built DALI pipelines) and rebuilt only
        # when what they produce changes (progressive resizing).
        self._loaders: dict[LoaderSpec, Any] = {}
        self._train_loader: Any = None
        self._resume: Any = None  # a checkpoint's train loader state (load_state_dict)
        self._saved_epoch: int | None = None  # ... and the epoch it was saved in

    def setup(self, stage: str) -> None:
        if self.schedule is not None and self.trainer is not None:
            # Progressive resizing needs a train loader per epoch. Set here rather than in train.py so
            # that the Trainer's construction stays independent of data options; Lightning reads this
            # attribute at every epoch start (fit_loop.setup_data).
            # (An attribute Lightning's data connector sets on the Trainer; the class does not declare it.)
            self.trainer.reload_dataloaders_every_n_epochs = 1  # type: ignore[attr-defined]

    @property
    def classes(self) -> list[str]:
        return list(self.backend.classes)

    @property
    def bad_images(self) -> BadImageLog:
        """This process's record of skipped files (every backend keeps one; data/bad_images.py)."""
        return self.backend.bad_images

    def _spec(self, split: str, batch_size: int, **options: Any) -> LoaderSpec:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        # The device this rank trains on: the CPU outside a fit (evaluate's own loop, tests).
        strategy = getattr(trainer, "strategy", None)
        device = strategy.root_device if strategy is not None else torch.device("cpu")
        return LoaderSpec(split, batch_size, rank, world, self.seed, device=device, **options)

    def _epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else 0

    def _loader(self, spec: LoaderSpec) -> Any:
        """The loader of SPEC, built once."""
        if spec not in self._loaders:
            # Close this split's stale loader first (its worker processes or DALI pipeline).
            self._close([k for k in self._loaders if k.split == spec.split])
            loader = self._loaders[spec] = self.backend.loader(spec)
            if spec.resume:  # a DALI loader took it in its build already (its load_state_dict does nothing)
                loader.load_state_dict(spec.resume)
        return self._loaders[spec]

    def _close(self, specs: list[LoaderSpec]) -> None:
        for spec in specs:
            loader = self._loaders.pop(spec)
            if hasattr(loader, "close"):  # stops its resources now (a DALI pipeline), not when it is collected
                loader.close()

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Every split's batch, on its device, as the model takes it (the backend's on_device). A loop of one's
        own over these loaders calls it too (evaluate's ONNX path)."""
        return self.backend.on_device(batch)

    def teardown(self, stage: str) -> None:
        self._close(list(self._loaders))

    def train_dataloader(self) -> Any:
        options: dict[str, Any] = {}
        if self.schedule is not None:
            epoch = self._epoch()
            options = self._stage_options(epoch)
            # A new loader for each stage, whose first pass is the stage's first epoch (not the epoch a resumed
            # process starts in): a backend that seeds per loader does not repeat the first stage's order.
            first = epoch
            while first > 0 and self._stage_options(first - 1) == options:
                first -= 1
            options["first_epoch"] = first
        limit = self.trainer.limit_train_batches if self.trainer is not None else 1.0
        # A saved state is offered to the loaders of the stages that had begun when it was saved; the backend
        # decides what of it applies (it wrote it). The first request may come before Lightning has restored the
        # epoch counter (configure_optimizers' estimated_stepping_batches), so the epoch now does not decide.
        resume = self._resume
        if self._saved_epoch is not None and int(options.get("first_epoch", 0)) > self._saved_epoch:
            resume = None
        spec = self._spec("train", self.batch_size, limit_batches=limit, resume=resume, **options)
        self._train_loader = self._loader(spec)
        return self._train_loader

    def _stage_options(self, epoch: int) -> dict[str, Any]:
        """The progressive-resizing schedule's loader options at EPOCH (image size, augmentation magnitude)."""
        assert self.schedule is not None
        options: dict[str, Any] = {"image_size": self.schedule.size(epoch)}
        if self.schedule.magnitude(epoch) is not None:
            options["augment_magnitude"] = self.schedule.magnitude(epoch)
        return options

    # Mid-epoch resume. The train loader is stateful (protocol.ResumableLoader), but Lightning 2.6 loads a
    # stateful loader's state only into a loader it creates after restoring the loops, and
    # `estimated_stepping_batches` (configure_optimizers) creates it before. A DataModule's state is restored
    # before that, so the loader's state travels here too, and reaches the backend with the loader's spec.
    def state_dict(self) -> dict[str, Any]:
        loader = self._train_loader
        if loader is None or not hasattr(loader, "state_dict"):
            return {}
        return {"train_loader": loader.state_dict(), "epoch": self._epoch()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict or {})
        epoch = state.pop("epoch", None)
        if "train_loader" in state:
            self._resume = state["train_loader"] or None
        elif state:
            # A checkpoint of an earlier imgcls, whose loader kept no state of its own, holds it in the DataModule's
            # own keys: handed over as it is, with its epoch (the backend that wrote it reads that layout too).
            self._resume = {**state, "epoch": epoch}
        else:
            self._resume = None
        self._saved_epoch = int(epoch) if epoch is not None else None

    def val_dataloader(self) -> Any:
        if self.schedule is None:
            return self._loader(self._spec("val", self.val_batch_size))
        return self._loader(self._spec("val", self.val_batch_size, image_size=self.schedule.final_size))
