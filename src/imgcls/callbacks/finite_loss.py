"""FiniteLoss: a NaN/Inf loss stops the run without a host sync per step, never letting it into a saved
checkpoint, naming the step and the LR. With fp16 AMP the loss scaler's skipped steps are counted, and only
a run of them stops the run."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch

from imgcls.callbacks.report import ReportCallback
from imgcls.distributed import SYNC_EVERY_N_STEPS, gather_objects
from imgcls.errors import TrainingError

log = logging.getLogger(__name__)


class FiniteLoss(L.Callback):
    """Non-finite losses, found without a host sync per step, and never in a saved checkpoint.

    Every micro-batch only keeps a reference to its loss (and, with a loss scaler, each optimizer step one
    comparison): no kernel, no sync. The host reads them (one sync) every `every_n_steps` optimizer steps, before every
    checkpoint save (on_save_checkpoint, on every rank, with a check that every floating weight and buffer
    is finite), and at each epoch's end. So a NaN can reach the weights for at most `every_n_steps` steps,
    and never a checkpoint: the save is refused and the run stops naming the step of the first bad loss.

    fp16 AMP (a GradScaler): a step whose gradients overflow is skipped by the scaler, which halves its
    scale. That is normal early in training, so it is counted (train.amp_skipped_steps in report.json), and
    only `max_consecutive_overflows` skipped steps in a row stop the run, with the unscaled loss."""

    def __init__(
        self,
        last_path: str | Path,
        report: ReportCallback | None = None,
        every_n_steps: int = SYNC_EVERY_N_STEPS,
        max_consecutive_overflows: int = 10,
    ) -> None:
        self.last_path = Path(last_path)
        self.report = report
        self.every_n_steps = every_n_steps
        self.max_consecutive_overflows = max_consecutive_overflows
        self.skipped_steps = 0  # as of the last check
        self._device: torch.device | None = None  # set at the first step: nothing to check before
        self._where: dict[int, tuple[int, int, float]] = {}  # step -> (epoch, batch, lr) since the last check
        self._batch_step = 0
        self._scale_before: torch.Tensor | None = None

    @staticmethod
    def _scaler(trainer: L.Trainer) -> Any:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        return scaler if scaler is not None and scaler.is_enabled() else None

    def _reset(self, device: torch.device) -> None:
        # Each step only keeps references to device tensors (no kernel, no host work beyond an append); check()
        # reads them all in its one sync. Per-step device arithmetic here cost ~5 kernels a step.
        self._device = device
        self._losses: list[tuple[int, torch.Tensor]] = []  # (step, loss) of each micro-batch since the last check
        self._overflows: list[torch.Tensor] = []  # per optimizer step with a loss scaler: did it skip (bool)?
        self._last_loss: torch.Tensor | None = None  # the unscaled loss of the last micro-batch (fp16)
        self._run = 0  # skipped steps in a row, as of the last check
        self._where = {}

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
            self.check(trainer, pl_module)

    def check(self, trainer: L.Trainer, pl_module: L.LightningModule, weights: dict[str, Any] | None = None) -> None:
        """The one host sync: read the losses and overflow flags kept since the last check (and with `weights`, a
        state dict, that its floating tensors are finite), agree over ranks, raise TrainingError if any rank saw a
        fault."""
        if self._device is None:
            return
        device = self._device
        finite = torch.ones((), dtype=torch.bool, device=device)
        if weights is not None:
            tensors = [t for t in weights.values() if torch.is_tensor(t) and t.is_floating_point()]
            if tensors:
                finite = torch.stack([torch.isfinite(t).all().to(device) for t in tensors]).all()
        losses, overflows = self._losses, self._overflows
        last = self._last_loss if self._last_loss is not None else torch.zeros((), device=device)
        parts = [finite.float().reshape(1), last.detach().float().reshape(1).to(device)]
        parts += [torch.stack([loss.float().reshape(()) for _, loss in losses]).to(device)] if losses else []
        parts += [torch.stack([flag.reshape(()) for flag in overflows]).float().to(device)] if overflows else []
        values = torch.cat(parts).tolist()
        ok, last_loss = values[0] == 1.0, values[1]
        loss_values, flags = values[2 : 2 + len(losses)], values[2 + len(losses) :]
        bad_step, bad_loss = -1, 0.0
        for (step, _), value in zip(losses, loss_values):
            if not math.isfinite(value):
                bad_step, bad_loss = step, value
                break
        skipped, run, max_run = 0, self._run, self._run
        for flag in flags:
            run = run + 1 if flag else 0
            skipped += bool(flag)
            max_run = max(max_run, run)
        self._losses, self._overflows, self._run = [], [], run
        fault = bad_step >= 0 or max_run >= self.max_consecutive_overflows or not ok
        where = ""
        # Any rank's fault stops every rank (the others would wait in the next collective), and every rank
        # names the same fault: the first faulty rank's, not its own clean values.
        if trainer.world_size > 1 and trainer.strategy.reduce_boolean_decision(fault, all=False):
            reports = gather_objects((fault, bad_step, bad_loss, max_run, last_loss, ok))
            rank = next(r for r, report in enumerate(reports) if report[0])
            fault, bad_step, bad_loss, max_run, last_loss, ok = reports[rank]
            where = f" on rank {rank}"
        elif trainer.world_size > 1:
            fault = False
        self._set_skipped(trainer, pl_module, skipped)
        if not fault:
            self._where = {s: w for s, w in self._where.items() if s >= trainer.global_step}
            return
        kept = f"the last good checkpoint is {self.last_path}" if self.last_path.exists() else "no checkpoint yet"
        if bad_step >= 0:
            step = int(bad_step)
            epoch, batch, lr = self._where.get(step, (trainer.current_epoch, -1, math.nan))
            raise TrainingError(
                f"train.loss is {bad_loss}{where} at step {step} (epoch {epoch}, batch {batch}) with lr {lr:.6g}; "
                f"found at step {trainer.global_step}, nothing after step {step} was saved, {kept} (resume "
                "with ckpt_path=last, e.g. with a lower recipe.lr_per_256)"
            )
        if max_run >= self.max_consecutive_overflows:
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
