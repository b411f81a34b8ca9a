"""Errors of the simulator's domain; only the command line maps them to exit codes and option names.

`SimConfigError` and `ModelError` are `ValueError`s (a bad value), `ModelFileError` is a model file that
cannot be read, `CalibrationError` a run directory that holds nothing to calibrate from.
"""

from __future__ import annotations


class SimError(Exception):
    """Base of the errors `trainguard.sim` raises on purpose."""


class SimConfigError(SimError, ValueError):
    """A job or policy value is out of range or inconsistent; ``field`` names the configuration field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field
        """Field of `JobConfig`/`PolicyConfig` (or ``trials``, ``seed``, ``size``) that is wrong."""
        self.problem = problem
        """The message without the field name, e.g. ``must be between 1 and 10,000,000, not 0``."""


class ModelError(SimError, ValueError):
    """A failure model holds an invalid value (unknown field or category, negative rate, ...)."""


class ModelFileError(SimError):
    """A failure model file is missing, unreadable or not valid TOML."""


class CalibrationError(SimError):
    """A run directory holds nothing the simulator can be calibrated from (no completed steps)."""
