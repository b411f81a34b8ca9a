"""The error the checkpointer raises: a save or restore that cannot be trusted."""

from __future__ import annotations

from trainguard.errors import EXIT_STORAGE, TrainguardError


class CheckpointError(TrainguardError):
    """A checkpoint could not be saved, committed, verified or restored (the message says why)."""

    exit_code = EXIT_STORAGE
