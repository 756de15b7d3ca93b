"""Progressive resizing: the train image size (and optionally the RandAugment magnitude) per epoch.

Two proven schedules rather than a new one:
- ramp (FFCV, ffcv-imagenet `train_imagenet.py` get_resolution): start_size until start_epoch, then a
  linear ramp snapped to a multiple of 32, end_size from end_epoch on (ResNet-50: 160 -> 192).
- stages (TF2 EfficientNet `--n_stages`, `runner.py`): epochs_per_stage = total_epochs // stages,
  size = int(start + (end - start) * (stage + 1) / stages), so the first stage is already above start.

The size is a pure function of the epoch, so a resumed run lands on the right size by itself. The data
module asks for a loader per epoch (Lightning's reload_dataloaders_every_n_epochs=1); backends cache
the loader per size, so only a size change rebuilds a DALI pipeline or a transform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from imgcls.data.augment import parse_randaugment

if TYPE_CHECKING:
    from imgcls.config.schema import DataSchema


@dataclass(frozen=True)
class ProgressiveSchedule:
    start_size: int
    end_size: int
    total_epochs: int
    stages: int | None = None
    start_epoch: int = 0
    end_epoch: int | None = None
    multiple_of: int = 32
    start_magnitude: int | None = None
    end_magnitude: int | None = None

    def _fraction(self, epoch: int) -> tuple[float, bool]:
        """How far along the schedule this epoch is (0..1), and whether it is a stage schedule."""
        if self.stages:
            per_stage = max(1, self.total_epochs // self.stages)
            stage = min(epoch // per_stage, self.stages - 1)
            return (stage + 1) / self.stages, True
        end = self.end_epoch if self.end_epoch is not None else self.total_epochs - 1
        if epoch <= self.start_epoch:
            return 0.0, False
        if epoch >= end:
            return 1.0, False
        return (epoch - self.start_epoch) / (end - self.start_epoch), False

    def size(self, epoch: int) -> int:
        fraction, staged = self._fraction(epoch)
        exact = self.start_size + (self.end_size - self.start_size) * fraction
        if staged:
            return int(exact)  # TF2: int(base + (target - base) * (stage + 1) / n_stages)
        if fraction in (0.0, 1.0):
            return self.start_size if fraction == 0.0 else self.end_size
        return int(round(exact / self.multiple_of)) * self.multiple_of  # FFCV: np.round(res / 32) * 32

    def magnitude(self, epoch: int) -> int | None:
        if self.start_magnitude is None or self.end_magnitude is None:
            return None
        if self.stages:  # TF2: np.linspace(base_randaug_mag, final, n_stages)[stage]
            per_stage = max(1, self.total_epochs // self.stages)
            stage = min(epoch // per_stage, self.stages - 1)
            fraction = stage / (self.stages - 1) if self.stages > 1 else 1.0
        else:
            fraction, _ = self._fraction(epoch)
        return int(round(self.start_magnitude + (self.end_magnitude - self.start_magnitude) * fraction))

    @property
    def final_size(self) -> int:
        """Validation runs at the size training ends with."""
        return self.size(self.total_epochs - 1)


def schedule_from_config(cfg: DataSchema) -> ProgressiveSchedule | None:
    """The data config's `progressive` block as a schedule; None when off. config.checks has checked its values."""
    prog = cfg.progressive
    if not prog.enabled:
        return None
    end_size = int(prog.end_size or cfg.image_size)
    start_size = int(prog.start_size or end_size)
    total = int(prog.total_epochs)
    stages = prog.stages
    start_epoch = int(prog.start_epoch)
    end_epoch = prog.end_epoch
    multiple = int(prog.multiple_of)
    start_mag = prog.start_magnitude
    end_mag = None
    if start_mag is not None:
        end_mag = parse_randaugment(str(cfg.randaugment))[1]
        start_mag = int(start_mag)
    return ProgressiveSchedule(
        start_size=start_size,
        end_size=end_size,
        total_epochs=total,
        stages=stages,
        start_epoch=start_epoch,
        end_epoch=end_epoch,
        multiple_of=multiple,
        start_magnitude=start_mag,
        end_magnitude=end_mag,
    )
