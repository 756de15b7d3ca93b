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
