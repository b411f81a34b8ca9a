"""One attempt number for the whole job, taken from torch's rendezvous round instead of a counter each agent keeps.

A node slow to a restart's rendezvous used to count on its own: the others formed a round without it, it joined
the next one, and it called that attempt 1 while they called it 2 (so its records, its faults and the goodput
report's interruptions drifted). The round is kept in the rendezvous store and every node of a round reads the same
number; the job's first round (agreed through the store once, `trainguard.torch_api.rendezvous.first_round`) makes
it start at 0. An extra round that formed without a late node is an attempt of the nodes in it; the late node
never sees it. Handlers without rounds (static, etcd v1) keep the local count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trainguard.torch_api import rendezvous

log = logging.getLogger(__name__)


class JobNumbering:
    """The job-wide attempt number of each round this agent joins."""

    def __init__(self, run_id: str, attempts_before: Callable[[], int] = lambda: 0) -> None:
        self.run_id = run_id
        self.attempts_before = attempts_before
        """Attempts the run dir already holds (a requeued job continues its numbers): asked of the first node only."""
        self._first: tuple[int, int] | None = None
        self._unavailable = False

    def after_rendezvous(self, handler: Any) -> int | None:
        """The attempt of the round ``handler`` has just joined, or None when the job has no shared round number
        (the caller keeps its own count)."""
        if self._unavailable:
            return None
        joined = rendezvous.round_of(handler)
        if joined is None:
            self._unavailable = True
            return None
        if self._first is None:
            self._first = rendezvous.first_round(handler, self.run_id, joined, self.attempts_before())
            if self._first is None:
                self._unavailable = True
                return None
        first_round, first_attempt = self._first
        if joined < first_round:  # cannot happen with one store; never number below the job's start
            log.warning("rendezvous round %d is before the job's first round %d", joined, first_round)
            return None
        return first_attempt + joined - first_round
