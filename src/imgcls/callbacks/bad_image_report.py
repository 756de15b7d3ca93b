"""BadImageReport: the files a run skipped under data.on_bad_image=skip (data/bad_images.py), over all ranks,
and the samples mixup left out of the batches they made odd, into report.json."""

from __future__ import annotations

from typing import Any, Protocol

import lightning as L

from imgcls.callbacks.report import ReportCallback
from imgcls.data.bad_images import BadImageLog
from imgcls.distributed import gather_objects


class MixupCounts(Protocol):
    """What the LightningModule tells about samples mixup had to leave out of a batch a bad file left odd."""

    def mixup_counts(self) -> dict[str, int]: ...


class BadImageReport(L.Callback):
    """The files skipped under data.on_bad_image=skip, over all ranks, into report.json. Put before
    ReportCallback in the callback list, so the count is in the row it writes."""

    def __init__(self, report: ReportCallback, bad_images: BadImageLog) -> None:
        self.report = report
        self.bad_images = bad_images  # this rank's log (the data module's)
        self.files: dict[str, str] = {}
        # Samples mixup dropped to even a batch a bad file left odd, and batches of one it could not mix
        # (module._mix), summed over ranks. Earlier processes of a resumed run count from the checkpoint,
        # as of its last epoch end or validation.
        self.mixup: dict[str, int] = {}
        self._mixup_before: dict[str, int] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.bad_images.files.update(self.files)  # a resumed run does not warn again about files it already reported

    def _collect(self, pl_module: MixupCounts) -> None:
        totals = dict(self._mixup_before)
        for files, rank_counts in gather_objects((dict(self.bad_images.files), pl_module.mixup_counts())):
            self.files.update(files)
            for key, value in rank_counts.items():
                totals[key] = totals.get(key, 0) + value
        self.mixup = {k: v for k, v in totals.items() if v}
        if self.files or self.mixup or "bad_images" in self.report.extra:
            self.report.extra["bad_images"] = {
                "count": len(self.files),
                "files": dict(sorted(self.files.items())),
                **self.mixup,
            }

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._collect(pl_module)  # type: ignore[arg-type]

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._collect(pl_module)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        return {"files": self.files, "mixup": self.mixup}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.files = dict(state_dict.get("files", {}))
        self.mixup = self._mixup_before = dict(state_dict.get("mixup", {}))
