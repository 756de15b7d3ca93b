"""Console and log-file output of the commands: every line once, in Hydra's format and in the run's log file.

Lightning gives its loggers (`lightning`, `lightning.pytorch`, `lightning.fabric`) handlers of their own and stops them
propagating when it is imported before logging is configured, which is always the case here (the commands
import it before Hydra configures logging): their lines then bypass Hydra's file handler, and any handler
added to the root prints them a second time. Once Hydra has configured logging, they are routed through the
root's handlers only. Lightning's advertisement for its cloud logger ("litlogger") is filtered out; it has
no switch of its own. So are the third-party warnings in QUIET_WARNINGS, each matched by its message and the
module it names: a user of imgcls can do nothing about them.
"""

from __future__ import annotations

import logging
import warnings

LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
ADVERTISEMENTS = ("💡 Tip:",)

# (message regex, category, module regex) of warnings nobody running imgcls can act on.
QUIET_WARNINGS = (
    # torch deprecated LeafSpec, which Lightning's copy of tree_flatten still builds: Lightning's to change.
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"),
    # Epochs shorter than trainer.log_every_n_steps: Lightning counts that interval over the run's steps, not an
    # epoch's, and imgcls logs every epoch's metrics itself (callbacks/report.py), so nothing is lost and the
    # advice to lower it "to see logs for the training epoch" is wrong here (a PossibleUserWarning: UserWarning).
    (r"The number of training batches \(\d+\) is smaller than the logging interval", UserWarning,
     r"lightning\.pytorch\.loops\.fit_loop"),
    # Every resume (ckpt_path=last, a requeue) saves into the run's checkpoints/ again, which is the point: imgcls's
    # checkpoint policy owns that folder (training/checkpoint.py; run/rundir.py refuses files it did not write).
    (r"Checkpoint directory .* exists and is not empty\.", UserWarning,
     r"lightning\.pytorch\.callbacks\.model_checkpoint"),
)  # fmt: skip


class _NoAdvertisements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(ADVERTISEMENTS)


def quiet_library_warnings() -> None:
    for message, category, module in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


def route_library_logs() -> None:
    """Call inside a Hydra app (its logging configured): library lines go through the root's handlers."""
    quiet_library_warnings()
    if not logging.getLogger().handlers:
        return  # logging not configured (e.g. a library call): leave Lightning's own handler
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoAdvertisements) for f in rank_zero.filters):
        rank_zero.addFilter(_NoAdvertisements())
