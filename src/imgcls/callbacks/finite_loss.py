"""FiniteLoss: a NaN/Inf loss stops the run without a host sync on the step path, never letting it into a saved
checkpoint, naming the step and the LR. With fp16 AMP the loss scaler's skipped steps are counted, and only
a run of them stops the run."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import lightning as L
import torch

from imgcls.callbacks.report import ReportCallback
from imgcls.distributed import SYNC_EVERY_N_STEPS, DeferredRead, gather_objects
from imgcls.errors import TrainingError

log = logging.getLogger(__name__)


@dataclass
class _Period:
    """What one check found about the steps since the previous one, on the device until a fault or a sync point
    needs it on the host: `found` is [fault, weights finite, last loss, longest run of skipped steps, skipped steps
    since the last host read, *the losses of `steps`]; `agreed` is any rank's fault."""

    found: torch.Tensor
    steps: list[int]
    where: dict[int, tuple[int, int, float]]
    agreed: DeferredRead


class FiniteLoss(L.Callback):
    """Non-finite losses, found without a host sync on the step path, and never in a saved checkpoint.

    Every micro-batch only keeps a reference to its loss (and, with a loss scaler, each optimizer step one
    comparison): no kernel, no sync. Every `every_n_steps` optimizer steps a check reduces them on the device to
    a fault flag, starts its all-reduce over ranks and its copy to the host without waiting for either, and reads
    the flag the previous check started, a period old and long finished: so a NaN stops every rank at the same
    step, at the latest 2 * `every_n_steps` steps after it happened. Every checkpoint save (on_save_checkpoint, on
    every rank, which also checks that every floating weight and buffer is finite), each epoch's end, validation
    and the end of training read both at once (a sync, off the step path): a NaN never reaches a checkpoint, the
    save is refused and the run stops naming the step of the first bad loss.

    fp16 AMP (a GradScaler): a step whose gradients overflow is skipped by the scaler, which halves its
    scale. That is normal early in training, so it is counted (train.amp_skipped_steps in report.json, as of the
    last sync point), and only `max_consecutive_overflows` skipped steps in a row stop the run, with the unscaled
    loss (precision.max_consecutive_overflows; None: no loss scaler, so no step is skipped)."""

    def __init__(
        self,
        last_path: str | Path,
        report: ReportCallback | None = None,
        every_n_steps: int = SYNC_EVERY_N_STEPS,
        max_consecutive_overflows: int | None = None,
    ) -> None:
        self.last_path = Path(last_path)
        self.report = report
        self.every_n_steps = every_n_steps
        self.max_consecutive_overflows = max_consecutive_overflows
        self.skipped_steps = 0  # as of the last sync point
        self._device: torch.device | None = None  # set at the first step: nothing to check before
        self._where: dict[int, tuple[int, int, float]] = {}  # step -> (epoch, batch, lr) since the last check
        self._batch_step = 0
        self._scale_before: torch.Tensor | None = None
        self._pending: _Period | None = None  # the last periodic check's, read at the next check

    @staticmethod
    def _scaler(trainer: L.Trainer) -> Any:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    def _reset(self, device: torch.device) -> None:
        # Each step only keeps references to device tensors (no kernel, no host work beyond an append); a check
        # reduces them on the device. Per-step device arithmetic here cost ~5 kernels a step.
        self._device = device
        self._losses: list[tuple[int, torch.Tensor]] = []  # (step, loss) of each micro-batch since the last check
        self._overflows: list[torch.Tensor] = []  # per optimizer step with a loss scaler: did it skip (bool)?
        self._last_loss: torch.Tensor | None = None  # the unscaled loss of the last micro-batch (fp16)
        # Device counters carried from check to check, so that no check needs the previous one's host values.
        self._run = torch.zeros((), device=device)  # skipped steps in a row
        self._skipped = torch.zeros((), device=device)  # skipped steps since the last host read
        self._where = {}
        self._pending = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset(pl_module.device)
        self._set_skipped(trainer, pl_module, 0)  # a resumed run's count, from its checkpoint

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_step = trainer.global_step
        if self._batch_step not in self._where:
            lr = trainer.optimizers[0].param_groups[-1]["lr"] if trainer.optimizers else math.nan
            self._where[self._batch_step] = (trainer.current_epoch, batch_idx, lr)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        scaler = self._scaler(trainer)
        if scaler is not None and scaler._scale is not None:  # noqa: SLF001 - the device tensor get_scale() syncs on
            self._scale_before = scaler._scale.clone()  # noqa: SLF001 - no grad: no detach (a dispatch)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._device is None:
            self._reset(pl_module.device)
        loss = outputs.get("loss_value", outputs.get("loss")) if isinstance(outputs, dict) else outputs
        scaler = self._scaler(trainer)
        if loss is not None:
            if scaler is not None:
                self._last_loss = loss  # reported only when the run stops; a non-finite fp16 loss is a skipped step
            else:
                # The module's loss_value is detached already; another's loss would hold its graph until the check.
                self._losses.append((self._batch_step, loss.detach() if loss.requires_grad else loss))
        if trainer.global_step == self._batch_step:
            return  # inside an accumulation window
        if scaler is not None and self._scale_before is not None:
            overflowed = getattr(scaler, "overflowed", None)  # a static scale (precision.py StaticGradScaler)
            if overflowed is None:
                overflowed = scaler._scale < self._scale_before  # noqa: SLF001 - a dynamic scale halves on a skip
            self._overflows.append(overflowed)
            self._scale_before = None
        if trainer.global_step % self.every_n_steps == 0:
            self.check(trainer, pl_module, now=False)

    def check(
        self, trainer: L.Trainer, pl_module: L.LightningModule, weights: dict[str, Any] | None = None, now: bool = True
    ) -> None:
        """Read the previous periodic check's fault flag (agreed over ranks), then reduce the losses and overflow
        flags kept since (and with `weights`, a state dict, whether its floating tensors are finite) to a new one.
        `now`: read that one too (a host sync: checkpoint saves, epoch ends); else it waits for the next check.
        Raises TrainingError if any rank saw a fault, on every rank alike."""
        if self._device is None:
            return
        if self._pending is not None:
            pending, self._pending = self._pending, None
            if pending.agreed.values()[0] > 0:
                self._stop(trainer, pending)
        period = self._reduce(trainer, weights)
        if not now:
            self._pending = period
            return
        if period.agreed.values()[0] > 0:
            self._stop(trainer, period)
        if self._scaler(trainer) is not None:
            self._skipped = torch.zeros((), device=self._device)
            self._set_skipped(trainer, pl_module, int(period.found[4].item()))

    def _reduce(self, trainer: L.Trainer, weights: dict[str, Any] | None) -> _Period:
        """The losses and flags since the last check, reduced on the device (a few kernels, no sync), and the
        fault flag's all-reduce and copy to the host started."""
        device = self._device
        assert device is not None  # check() returns before the first step
        finite = torch.ones((), dtype=torch.bool, device=device)
        if weights is not None:
            tensors = [t for t in weights.values() if torch.is_tensor(t) and t.is_floating_point()]
            if tensors:
                finite = torch.stack([torch.isfinite(t).all().to(device) for t in tensors]).all()
        losses, overflows = self._losses, self._overflows
        self._losses, self._overflows = [], []
        last = self._last_loss if self._last_loss is not None else torch.zeros((), device=device)
        values = torch.stack([loss.float().reshape(()) for _, loss in losses]).to(device) if losses else None
        longest = self._run
        if overflows:
            flags = torch.stack([flag.reshape(()) for flag in overflows]).float().to(device)
            # The run of skipped steps at each step, the carried run first: the running count of skips less its
            # value at the last step that was not skipped.
            counts = self._run + flags.cumsum(0)
            runs = counts - torch.where(flags > 0, 0.0, counts).cummax(0).values
            longest = torch.maximum(runs.max(), self._run)
            self._run, self._skipped = runs[-1], self._skipped + flags.sum()
        fault = ~finite
        if self.max_consecutive_overflows is not None:
            fault = fault | (longest >= self.max_consecutive_overflows)
        if values is not None:
            fault = fault | ~torch.isfinite(values).all()
        summary = [fault.float(), finite.float(), last.detach().float().reshape(()).to(device), longest, self._skipped]
        found = torch.cat([torch.stack(summary), *([values] if values is not None else [])])
        where = dict(self._where)
        self._where = {s: w for s, w in self._where.items() if s >= trainer.global_step}
        agreed = DeferredRead(fault.float().reshape(1), over_ranks=trainer.world_size > 1)
        return _Period(found, [step for step, _ in losses], where, agreed)

    def _stop(self, trainer: L.Trainer, period: _Period) -> NoReturn:
        """Some rank's check found a fault: every rank names the first faulty rank's, not its own clean values
        (the run ends here: host reads and a gather are no cost now)."""
        values = period.found.tolist()
        fault, ok, last_loss, max_run = values[0] > 0, values[1] > 0, values[2], values[3]
        bad_step, bad_loss = -1, 0.0
        for step, value in zip(period.steps, values[5:]):
            if not math.isfinite(value):
                bad_step, bad_loss = step, value
                break
        where = ""
        if trainer.world_size > 1:
            reports = gather_objects((fault, bad_step, bad_loss, max_run, last_loss, ok))
            rank = next(r for r, report in enumerate(reports) if report[0])
            fault, bad_step, bad_loss, max_run, last_loss, ok = reports[rank]
            where = f" on rank {rank}"
        kept = f"the last good checkpoint is {self.last_path}" if self.last_path.exists() else "no checkpoint yet"
        if bad_step >= 0:
            step = int(bad_step)
            epoch, batch, lr = period.where.get(step, (trainer.current_epoch, -1, math.nan))
            raise TrainingError(
                f"train.loss is {bad_loss}{where} at step {step} (epoch {epoch}, batch {batch}) with lr {lr:.6g}; "
                f"found at step {trainer.global_step}, nothing after step {step} was saved, {kept} (resume "
                "with ckpt_path=last, e.g. with a lower recipe.lr_per_256)"
            )
        if self.max_consecutive_overflows is not None and max_run >= self.max_consecutive_overflows:
            lr = trainer.optimizers[0].param_groups[-1]["lr"] if trainer.optimizers else math.nan
            raise TrainingError(
                f"fp16 gradients overflowed{where} in {int(max_run)} optimizer steps in a row (precision."
                f"max_consecutive_overflows={self.max_consecutive_overflows}) by step {trainer.global_step}, "
                f"train.loss (unscaled) {last_loss}, lr {lr:.6g}; the loss scaler skipped them all, {kept} "
                "(resume with ckpt_path=last, e.g. with a lower recipe.lr_per_256 or precision=fp32)"
            )
        raise TrainingError(
            f"a weight or buffer of the model is not finite{where} at step {trainer.global_step} (the loss was); "
            f"not saved, {kept}"
        )

    def _set_skipped(self, trainer: L.Trainer, pl_module: L.LightningModule, new: int) -> None:
        if self._scaler(trainer) is None:
            return
        if new:
            log.info("AMP loss scaler skipped %d step(s) by step %d", new, trainer.global_step)
        self.skipped_steps += new
        if self.report is not None:
            self.report.counters["train.amp_skipped_steps"] = self.skipped_steps

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # Every rank runs this while a checkpoint is assembled, before rank 0 writes it.
        self.check(trainer, pl_module, weights=checkpoint.get("state_dict") or pl_module.state_dict())
        checkpoint.setdefault("callbacks", {})  # state_dict() below ran before this check: refresh the count
        for key, state in checkpoint["callbacks"].items():
            if key == self.state_key:
                state["skipped_steps"] = self.skipped_steps

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module)  # before ReportCallback's row (this callback comes first)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.check(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check(trainer, pl_module)  # a run without checkpoints does not end "successfully" on NaN weights

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
