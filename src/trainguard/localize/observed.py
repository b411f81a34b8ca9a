"""What the supervisor saw of each rank when it gathered a hang's evidence (``process_state.json``).

A rank that left no flight-recorder dump either died or could not answer: a process stopped with SIGSTOP,
or one too busy or frozen to serve the dump request. The dumps alone cannot tell those apart, so the
supervisor writes what it saw beside them and `trainguard diagnose` reads it: a silent live rank is the
culprit of a hang, not a crash. The file is untrusted input like the dumps (bounded, validated).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from trainguard.core.protocol import PROCESS_STATE_FILE
from trainguard.localize.reader import MAX_RANK

__all__ = ["PROCESS_STATE_FILE", "Observed", "read_observed"]
_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Observed:
    """Ranks the supervisor found alive when it asked every live rank for its dump."""

    stopped: frozenset[int]
    """Processes in the stopped state (SIGSTOP, a debugger)."""
    unanswered: frozenset[int]
    """Running processes that did not answer the dump request in time."""

    @property
    def silent(self) -> frozenset[int]:
        """Alive but without a word: stopped or unanswered."""
        return self.stopped | self.unanswered


def _ranks(value: object) -> frozenset[int] | None:
    if not isinstance(value, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in value):
        return None
    return frozenset(r for r in value if 0 <= r <= MAX_RANK)


def read_observed(directory: Path | None) -> Observed | None:
    """``directory``'s `PROCESS_STATE_FILE`, or None when absent or not what the supervisor writes."""
    if directory is None:
        return None
    path = directory / PROCESS_STATE_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not os.path.isfile(path):
                return None
            data = json.loads(f.read(_MAX_BYTES + 1)[:_MAX_BYTES + 1])
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    stopped, unanswered = _ranks(data.get("stopped", [])), _ranks(data.get("unanswered", []))
    if stopped is None or unanswered is None:
        return None
    return Observed(stopped=stopped, unanswered=unanswered)
