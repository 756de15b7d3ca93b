"""The LightningDataModule: one interface over every data backend."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch

from imgcls.data.backends import make_backend
from imgcls.data.bad_images import BadImageLog
from imgcls.data.demo import ensure_demo_dataset
from imgcls.data.device_normalize import DeviceNormalize
from imgcls.data.progressive import ProgressiveSchedule, schedule_from_config
from imgcls.distributed import gather_objects

log = logging.getLogger(__name__)


class ClassificationDataModule(L.LightningDataModule):
    """Builds the backend at construction (so the class list is known before the model is built)."""

    def __init__(self, cfg: Any, batch_size: int, seed: int = 0) -> None:
        super().__init__()
        if cfg.name == "demo":
            ensure_demo_dataset(cfg.root)
        self.cfg = cfg
        self.batch_size = batch_size
        self.val_batch_size = int(cfg.val_batch_size or batch_size)
        self.seed = seed
        self.backend = make_backend(cfg)
        self.normalize = DeviceNormalize(cfg.mean, cfg.std, channels_last=bool(cfg.get("channels_last")))
        self.schedule: ProgressiveSchedule | None = schedule_from_config(cfg)
        # Loaders are kept between epochs (persistent workers, built DALI pipelines) and rebuilt only
        # when what they produce changes (progressive resizing).
        self._loaders: dict[tuple, Any] = {}
        self._train_loader: Any = None
        self._resume: dict[str, Any] | None = None  # the train loader's position from a checkpoint
        # The epoch a resumed run goes on in (load_state_dict); kept after the position is used or dropped.
        self._resumed_epoch: int | None = None

    def setup(self, stage: str) -> None:
        if self.schedule is not None and self.trainer is not None:
            # Progressive resizing needs a train loader per epoch. Set here rather than in train.py so
            # that the Trainer's construction stays independent of data options; Lightning reads this
            # attribute at every epoch start (fit_loop.setup_data).
            self.trainer.reload_dataloaders_every_n_epochs = 1

    @property
    def classes(self) -> list[str]:
        return list(self.backend.classes)

    @property
    def bad_images(self) -> BadImageLog:
        """This process's record of skipped files (every backend keeps one; data/bad_images.py)."""
        return self.backend.bad_images

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _device(self) -> torch.device:
        """The device this rank trains on: where synthetic batches are made and loaded batches are copied to."""
        strategy = getattr(self.trainer, "strategy", None)  # None outside a fit (evaluate's own loop, tests)
        return strategy.root_device if strategy is not None else torch.device("cpu")

    def _epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else 0

    def _loader(self, split: str, batch_size: int, position: dict[str, Any] | None = None, **options: Any) -> Any:
        """The split's loader for these options, built once; `position`: a DALI reader position to build it at."""
        rank, world = self._rank_world()
        key = (split, batch_size, rank, world, *sorted(options.items()))
        if key not in self._loaders:
            # Close this split's stale loader first (its worker processes or DALI pipeline).
            self._close([k for k in self._loaders if k[0] == split])
            extra = {"position": position} if position else {}
            self._loaders[key] = self.backend.loader(
                split, batch_size, rank, world, self.seed, device=self._device(), **options, **extra
            )
        return self._loaders[key]

    def _close(self, keys: list[tuple]) -> None:
        for key in keys:
            loader = self._loaders.pop(key)
            if hasattr(loader, "close"):  # a DALI loader stops its pipeline now, not when it is collected
                loader.close()

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Every split's batch, on its device: uint8 images become normalized float there (device_normalize.py).
        A loop of one's own over these loaders calls it too (evaluate's ONNX path)."""
        return (self.normalize(batch[0]), *batch[1:])  # labels (and any further outputs) as they are

    def teardown(self, stage: str) -> None:
        self._close(list(self._loaders))

    def train_dataloader(self) -> Any:
        options: dict[str, Any] = {}
        if self.schedule is not None:
            epoch = self._epoch()
            options = self._stage_options(epoch)
            # A new loader for each stage: seeded from the stage's first epoch (not the epoch a resumed process
            # starts in), so that each stage's DALI reader does not repeat the first stage's order.
            first = epoch
            while first > 0 and self._stage_options(first - 1) == options:
                first -= 1
            options["first_epoch"] = first
        if self._resumed_epoch is not None and getattr(self.backend, "builds_at_position", False):
            # A resumed DALI loader that cannot go on from its saved position (another world size or per-device
            # batch, data.dali_checkpointing=false) starts fresh: seeded from the epoch being resumed, not epoch 0
            # (or its stage's first), whose order and augmentation draws it would replay. A loader built at its
            # position takes the saved loader's order and seed instead (DaliBackend.loader).
            options["first_epoch"] = max(int(options.get("first_epoch", 0)), self._resumed_epoch)
        # A DALI loader is built at this rank's saved position. The first request may come before Lightning has
        # restored the epoch counter: the position itself says whether its epoch had ended (DaliLoader).
        loader = self._train_loader = self._loader("train", self.batch_size, self._dali_position(), **options)
        if self._resume is not None:
            later = self._epoch() > int(self._resume["epoch"])
            if "train_loader" in self._resume and not later and hasattr(loader, "load_state_dict"):
                loader.load_state_dict(self._resume["train_loader"])
            if later:
                self._resume = None  # a later epoch's loader (progressive resizing) starts fresh
        return loader

    def _stage_options(self, epoch: int) -> dict[str, Any]:
        """The progressive-resizing schedule's loader options at EPOCH (image size, augmentation magnitude)."""
        assert self.schedule is not None
        options: dict[str, Any] = {"image_size": self.schedule.size(epoch)}
        if self.schedule.magnitude(epoch) is not None:
            options["augment_magnitude"] = self.schedule.magnitude(epoch)
        return options

    def _dali_position(self) -> dict[str, Any] | None:
        """This rank's saved DALI reader position, while a resume has one (only a DALI backend takes it)."""
        if self._resume is None or "dali" not in self._resume or not getattr(self.backend, "builds_at_position", False):
            return None
        positions, (rank, world) = self._resume["dali"], self._rank_world()
        if len(positions) != world:
            log.warning(
                "resuming %d ranks from %d: the DALI readers start epoch %d again instead of at the saved batch",
                world, len(positions), self._resumed_epoch,
            )  # fmt: skip
            self._resume = {key: value for key, value in self._resume.items() if key != "dali"}
            return None
        return positions[rank]

    # Mid-epoch resume. The train loader is stateful (samplers.ResumableDataLoader), but Lightning 2.6 loads
    # a stateful loader's state only into a loader it creates after restoring the loops, and
    # `estimated_stepping_batches` (configure_optimizers) creates it before. A DataModule's state is
    # restored before that, so the position travels here too (loading it twice is harmless). A DALI loader's
    # position differs per rank (each reads its own records): every rank's is gathered, and each takes its own.
    def state_dict(self) -> dict[str, Any]:
        loader = self._train_loader
        if hasattr(loader, "position"):
            steps = self.trainer.num_training_batches if self.trainer is not None else None
            steps = int(steps) if isinstance(steps, int) else None
            return {"dali": gather_objects(loader.position(steps)), "epoch": self._epoch()}
        return {"train_loader": loader.state_dict()} if hasattr(loader, "state_dict") else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "train_loader" in state_dict:  # the sampler's epoch; a DALI position saves the trainer's
            state_dict = {**state_dict, "epoch": state_dict["train_loader"].get("epoch", 0)}
        self._resume = dict(state_dict) if state_dict else None
        self._resumed_epoch = None
        if self._resume is not None and "epoch" in self._resume:
            # The saved epoch, or the next one where every saved position had ended its epoch (a checkpoint at an
            # epoch's end). Without positions (data.dali_checkpointing=false) the saved epoch.
            positions = self._resume.get("dali") or []
            ended = bool(positions) and all(p and p.get("done") for p in positions)
            self._resumed_epoch = int(self._resume["epoch"]) + int(ended)

    def val_dataloader(self) -> Any:
        if self.schedule is None:
            return self._loader("val", self.val_batch_size)
        return self._loader("val", self.val_batch_size, image_size=self.schedule.final_size)
