"""The project's error types: each one is a single clear line for the user, never a traceback."""

from __future__ import annotations


class RLGraphstepError(Exception):
    """Base of every error the command line reports as one line with a non-zero exit."""


class ConfigError(RLGraphstepError, ValueError):
    """A configuration value, key or file is wrong."""


class EnvError(RLGraphstepError, ValueError):
    """An environment cannot be made or does not suit the algorithm."""


class CaptureError(RLGraphstepError, RuntimeError):
    """An update could not be captured as a CUDA graph."""
