"""User-facing errors: one clear line, a non-zero exit, no traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input (config, data, checkpoint). Printed as one line, exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """A configuration value that is missing, malformed or not allowed."""


class DataError(UserError):
    """A dataset root, split or image that cannot be used."""


class CheckpointError(UserError):
    """A checkpoint that is missing, unreadable or for another model."""


class TrainingError(UserError):
    """Training cannot go on (a NaN/Inf loss). Exit code 3: the input may be fine, the run is not."""

    exit_code = 3


class StorageError(UserError):
    """The run dir or a checkpoint cannot be written (permissions, full disk). Exit code 4."""

    exit_code = 4
