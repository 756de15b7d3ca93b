"""Console and log-file output of the commands: every line once, in Hydra's format and in the run's log file.

Lightning gives its loggers (`lightning`, `lightning.pytorch`, `lightning.fabric`) handlers of their own and stops them
propagating when it is imported before logging is configured, which is always the case here (the commands
import it before Hydra configures logging): their lines then bypass Hydra's file handler, and any handler
added to the root prints them a second time. Once Hydra has configured logging, they are routed through the
root's handlers only. Lightning's advertisement for its cloud logger ("litlogger") is filtered out; it has
no switch of its own.
"""

from __future__ import annotations

import logging

LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
ADVERTISEMENTS = ("💡 Tip:",)


class _NoAdvertisements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(ADVERTISEMENTS)


def route_library_logs() -> None:
    """Call inside a Hydra app (its logging configured): library lines go through the root's handlers."""
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
