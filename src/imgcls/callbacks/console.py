"""What Lightning draws on the console, told the way imgcls's epoch lines tell it (callbacks/epoch_log.py).

- The progress bar counts epochs from 1 of the recipe's epochs, as the epoch line does (`Epoch 2/5` next to
  `epoch 2/5`; Lightning's bar said `Epoch 1/4`), and shows no logger version (`v_num: csv`, a folder name).
- The bar is drawn only on a terminal. Elsewhere (a SLURM log, a pipe, `| tee`) rich leaves each epoch's last
  frame, its metrics on a stray line of their own, and tqdm a line per redraw: the progress and epoch lines
  (callbacks/epoch_log.py) already say it all.
- While a bar is drawn, it shows the loss of the latest progress line (no value of its own: Lightning reads
  progress-bar metrics on the host every batch), and the console's log lines are printed through the bar
  (`BarLogRouting`): above it, instead of into it (Hydra's console handler writes to the terminal directly). The
  progress lines stay off the console then (the bar says as much) and still go to the run's log file.
- The model summary goes through logging (so also into the run's log file), without the FLOPs column and total
  when Lightning measured none (it counts FLOPs only on a module's `example_input_array`, and printed
  `Total FLOPs: 0`).
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, ProgressBar, RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import convert_inf
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

from imgcls.callbacks.epoch_log import PROGRESS_LOGGER

log = logging.getLogger("lightning.pytorch.callbacks.model_summary")  # where Lightning's own summary logs


class _Through(io.TextIOBase):
    """A log handler's stream that hands each record's text to `write_text` (the bar's own printing)."""

    def __init__(self, write_text: Callable[[str], None]) -> None:
        super().__init__()
        self._write_text = write_text

    def write(self, text: str) -> int:
        self._write_text(text)
        return len(text)


class _NotProgressLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != PROGRESS_LOGGER


class BarLogRouting:
    """While a bar is drawn: the root logger's console handlers (those writing to a terminal; the log file's are
    left alone) print through the bar and leave the progress lines out; given back when the bar stops."""

    def __init__(self) -> None:
        self._swapped: list[tuple[logging.StreamHandler[Any], Any]] = []
        self._filter = _NotProgressLines()

    @property
    def active(self) -> bool:
        return bool(self._swapped)

    def start(self, through: Callable[[Any], Callable[[str], None]]) -> None:
        """`through(stream)`: how text that a handler wrote to `stream` is printed while the bar is drawn."""
        if self._swapped:
            return
        for handler in logging.getLogger().handlers:
            if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
                continue
            isatty = getattr(handler.stream, "isatty", None)
            if isatty is None or not isatty():
                continue
            original = handler.setStream(_Through(through(handler.stream)))
            handler.addFilter(self._filter)
            self._swapped.append((handler, original))

    def stop(self) -> None:
        for handler, original in self._swapped:
            handler.setStream(original)
            handler.removeFilter(self._filter)
        self._swapped = []


class _BarMetrics:
    """The bar's metrics without Lightning's `v_num` (the logger's version: here always the folder `csv`), with the
    latest progress line's loss (`loss_of`)."""

    loss_of: Callable[[], float | None] | None = None

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        items.pop("v_num", None)
        loss = self.loss_of() if self.loss_of is not None else None
        if loss is not None:
            items["loss"] = f"{loss:.4f}"
        return items


class RichBar(_BarMetrics, RichProgressBar):
    def __init__(self, epochs: int, refresh_rate: int = 1, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self.epochs = int(epochs)
        self.routing = BarLogRouting()

    def _init_progress(self, trainer: L.Trainer) -> None:
        super()._init_progress(trainer)
        console = self._console
        if self.is_enabled and self.progress is not None and console is not None:
            # Console.out: no markup, highlighting or wrapping of the line; printed above the live bar.
            self.routing.start(lambda stream: lambda text: console.out(text, end="", highlight=False))

    def _stop_progress(self) -> None:
        super()._stop_progress()
        self.routing.stop()

    def _get_train_description(self, current_epoch: int) -> str:
        description = f"Epoch {current_epoch + 1}/{self.epochs}"
        # As Lightning pads it: the train and validation bars' descriptions line up.
        return f"{description:{max(len(description), len(self.validation_description))}}"


class TqdmBar(_BarMetrics, TQDMProgressBar):
    def __init__(self, epochs: int, refresh_rate: int = 1, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self.epochs = int(epochs)
        self.routing = BarLogRouting()

    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_start(trainer, *args)
        if self.is_enabled:
            from tqdm import tqdm

            # tqdm.write clears the bars, writes to the handler's own stream, and draws them again.
            self.routing.start(lambda stream: lambda text: tqdm.write(text, file=stream, end=""))

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        super().on_train_end(trainer, *args)
        self.routing.stop()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self.routing.stop()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        super().on_exception(trainer, pl_module, exception)
        self.routing.stop()

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


def progress_bar(
    kind: str | None, epochs: int, every_n_steps: int = 1, loss_of: Callable[[], float | None] | None = None
) -> ProgressBar | None:
    """callbacks.progress_bar: the bar of `kind` (switched off when its stream is no terminal: it stays in the
    callbacks, so that Lightning adds no bar of its own), or None for none; `loss_of`: the loss it shows."""
    kind = "none" if kind is None else str(kind)  # one of config.choices.PROGRESS_BARS (config/checks.py)
    if kind == "none":
        return None
    bar: RichBar | TqdmBar
    if kind == "rich":
        bar = RichBar(epochs, refresh_rate=every_n_steps, leave=True)
    else:
        bar = TqdmBar(epochs, refresh_rate=every_n_steps)
    bar.loss_of = loss_of
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
