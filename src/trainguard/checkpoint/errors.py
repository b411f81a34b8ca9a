"""The error the checkpointer raises: a save or restore that cannot be trusted.

Defined with the rest of the exception tree in `trainguard.errors` (importable without torch).
"""

from __future__ import annotations

from trainguard.errors import CheckpointError

__all__ = ["CheckpointError"]
