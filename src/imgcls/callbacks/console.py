"""What Lightning draws on the console, told the way imgcls's epoch lines tell it (callbacks/epoch_log.py).

- The progress bar counts epochs from 1 of the recipe's epochs, as the epoch line does (`Epoch 2/5` next to
  `epoch 2/5`; Lightning's bar said `Epoch 1/4`), and shows no logger version (`v_num: csv`, a folder name).
- The bar is drawn only on a terminal. Elsewhere (a SLURM log, a pipe, `| tee`) rich leaves each epoch's last
  frame, its metrics on a stray line of their own, and tqdm a line per redraw: the epoch lines already say it all.
- The model summary goes through logging (so also into the run's log file), without the FLOPs column and total
  when Lightning measured none (it counts FLOPs only on a module's `example_input_array`, and printed
  `Total FLOPs: 0`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, ProgressBar, RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import convert_inf
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

log = logging.getLogger("lightning.pytorch.callbacks.model_summary")  # where Lightning's own summary logs


class _WithoutVersion:
    """The bar's metrics without Lightning's `v_num` (the logger's version: here always the folder `csv`)."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        items.pop("v_num", None)
        return items


class RichBar(_WithoutVersion, RichProgressBar):
    def __init__(self, epochs: int, refresh_rate: int = 1, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self.epochs = int(epochs)

    def _get_train_description(self, current_epoch: int) -> str:
        description = f"Epoch {current_epoch + 1}/{self.epochs}"
        # As Lightning pads it: the train and validation bars' descriptions line up.
        return f"{description:{max(len(description), len(self.validation_description))}}"


class TqdmBar(_WithoutVersion, TQDMProgressBar):
    def __init__(self, epochs: int, refresh_rate: int = 1, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self.epochs = int(epochs)

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        # Lightning's, with the description set before the bar is first redrawn (after would flash `Epoch 0`).
        if self._leave:
            self.train_progress_bar = self.init_train_tqdm()
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch + 1}/{self.epochs}", refresh=False)
        self.train_progress_bar.reset(total=convert_inf(self.total_train_batches))
        self.train_progress_bar.initial = 0


def on_a_terminal(kind: str) -> bool:
    """Whether the stream the bar draws on is a terminal: rich draws on stdout (its console, which also knows
    FORCE_COLOR and Jupyter), tqdm on stderr."""
    if kind == "rich":
        from rich import get_console

        console = get_console()
        return bool(console.is_terminal or console.is_jupyter)
    return sys.stderr.isatty()


def progress_bar(kind: str | None, epochs: int, every_n_steps: int = 1) -> ProgressBar | None:
    """callbacks.progress_bar: the bar of `kind` (switched off when its stream is no terminal: it stays in the
    callbacks, so that Lightning adds no bar of its own), or None for none."""
    kind = "none" if kind is None else str(kind)  # one of config.choices.PROGRESS_BARS (config/checks.py)
    if kind == "none":
        return None
    bar: ProgressBar
    if kind == "rich":
        bar = RichBar(epochs, refresh_rate=every_n_steps, leave=True)
    else:
        bar = TqdmBar(epochs, refresh_rate=every_n_steps)
    if not on_a_terminal(kind):
        bar.disable()
    return bar


class MeasuredModelSummary(ModelSummary):
    """Lightning's model summary, logged, with FLOPs only when Lightning measured them."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if total_flops:
            ModelSummary.summarize(
                summary_data, total_parameters, trainable_parameters, model_size, total_training_modes, total_flops,
                **summarize_kwargs,
            )  # fmt: skip
            return
        columns = [column for column in summary_data if column[0] != "FLOPs"]
        table = _format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *columns
        )
        lines = table.splitlines()
        if lines and lines[-1].endswith("Total Flops"):
            lines.pop()  # its last line, the FLOPs total
        log.info("\n" + "\n".join(lines))
