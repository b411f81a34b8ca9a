"""Hang detection from heartbeats: a timeout learned from observed step times, with allowances.

Pure logic (no torch, no processes) so it is unit-tested directly. Progress of a rank is the end of
its last completed step. A rank is hung when no step ended for longer than its deadline:

* before its first step in an attempt: ``first_step_allowance_seconds`` from the attempt's start
  (imports, process-group set-up, checkpoint restore);
* inside a ``checkpoint`` phase, or ``done`` (training over, the rank is shutting down): at least
  ``checkpoint_allowance_seconds`` from the phase's start;
* otherwise ``max(floor_seconds, multiplier * median step time)`` from the last step's end.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

_ALLOWANCE_PHASES = ("checkpoint", "done")


@dataclass(frozen=True)
class WatchdogConfig:
    """How the agent decides a job is hung."""

    floor_seconds: float = 4.0
    """Never call a hang sooner than this after the last step ended."""
    multiplier: float = 3.0
    """Hang timeout = multiplier x median observed step time (if above the floor)."""
    first_step_allowance_seconds: float = 120.0
    """Time from an attempt's start to its first completed step (startup and restore)."""
    checkpoint_allowance_seconds: float = 120.0
    """Time allowed inside a checkpoint phase."""
    samples: int = 50
    """Step times remembered for the median."""

    def max_timeout_seconds(self) -> float:
        """The longest the watchdog can wait: the process-group timeout must exceed this."""
        return max(self.first_step_allowance_seconds, self.checkpoint_allowance_seconds, self.floor_seconds)


@dataclass(frozen=True)
class Verdict:
    """A hang the watchdog found."""

    ranks: tuple[int, ...]
    """Ranks past their deadline."""
    onset: float
    """Wall time of the job's last progress (the latest step end over the ranks watched)."""
    timeout_seconds: float
    last_steps: dict[int, int]
    """Last completed step per rank watched."""


class Watchdog:
    """Feeds on heartbeat snapshots; `check` says whether the job is hung now."""

    def __init__(self, config: WatchdogConfig) -> None:
        self.config = config
        self._durations: deque[float] = deque(maxlen=config.samples)
        self._seen: dict[int, int] = {}
        self.attempt_start = 0.0

    def new_attempt(self, start: float) -> None:
        self.attempt_start = start
        self._seen.clear()

    def median_step_seconds(self) -> float | None:
        return statistics.median(self._durations) if self._durations else None

    def timeout_seconds(self) -> float:
        median = self.median_step_seconds()
        learned = self.config.multiplier * median if median is not None else 0.0
        return max(self.config.floor_seconds, learned)

    def observe(self, rank: int, beat: dict[str, Any]) -> None:
        """Record a heartbeat; a new completed step contributes its duration to the median."""
        steps_done = int(beat["steps_done"])
        if steps_done > self._seen.get(rank, 0):
            self._seen[rank] = steps_done
            if beat["duration_seconds"] > 0:
                self._durations.append(float(beat["duration_seconds"]))

    def check(self, beats: dict[int, dict[str, Any] | None], now: float) -> Verdict | None:
        """``beats``: latest heartbeat per watched rank (None = not written yet)."""
        if not beats:
            return None
        timeout = self.timeout_seconds()
        late: list[int] = []
        progress: list[float] = []
        last_steps: dict[int, int] = {}
        for rank, beat in beats.items():
            if beat is None or beat["steps_done"] == 0 or beat["time"] < self.attempt_start:
                deadline = self.attempt_start + self.config.first_step_allowance_seconds
                last = self.attempt_start
                if beat is not None and beat["phase"] in _ALLOWANCE_PHASES:
                    deadline = max(deadline, beat["phase_start"] + self.config.checkpoint_allowance_seconds)
            else:
                last = beat["time"]
                deadline = last + timeout
                if beat["phase"] in _ALLOWANCE_PHASES:
                    deadline = max(deadline, beat["phase_start"] + self.config.checkpoint_allowance_seconds)
            last_steps[rank] = beat["step"] if beat is not None else 0
            progress.append(last)
            if now > deadline:
                late.append(rank)
        if not late:
            return None
        return Verdict(tuple(sorted(late)), max(progress), timeout, last_steps)
