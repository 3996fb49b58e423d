"""The one exception type users see.

A `LeantrainError` is bad input or a bad environment that the user can fix. The CLI prints its
message as one line and exits with code 2, without a traceback; anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations


class LeantrainError(Exception):
    """A problem the user can fix; the message names the file, field or flag and the fix."""

    exit_code = 2


class ConfigError(LeantrainError):
    """A config key or flag has a bad value."""


class DataError(LeantrainError):
    """A data file or column is unusable."""


class ModelError(LeantrainError):
    """A model path or name does not lead to a usable model."""
