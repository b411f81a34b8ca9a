"""The hang timeout learned from the job's own step intervals, and a replay of recorded runs through it.

Pure arithmetic on seconds: no clock, no torch. The timeout is the longest of the recent step intervals (step
end to step end) times a safety factor, never below a floor; until a few intervals are known it is at least
the warm-up minimum. nvidia-resiliency-ext computes its heartbeat timeouts the same way in spirit, from the
intervals it observed (docs: https://nvidia.github.io/nvidia-resiliency-ext/fault_tolerance/integration/
heartbeats.html); trainguard's agent keeps the intervals for the whole job, across restarts, where NVRx keeps
its timeouts in the script's checkpoint. The start of an attempt (imports, rendezvous, restore) is not a
step interval: the first-step allowance covers it (`trainguard.launch.watchdog`).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TimeoutModel:
    """How the hang timeout follows the observed step intervals."""

    floor_seconds: float
    """Never a shorter timeout than this (measured: docs/decisions.md, "hang timeout")."""
    multiplier: float
    """Safety factor over the longest recent interval."""
    samples: int
    """How many recent intervals are remembered; the longest of them counts."""
    warmup_samples: int
    """Until this many intervals are known, the timeout is at least ``warmup_seconds``."""
    warmup_seconds: float


class StepIntervals:
    """The recent step intervals of a job and the timeout they give."""

    def __init__(self, model: TimeoutModel) -> None:
        self.model = model
        self._recent: deque[float] = deque(maxlen=model.samples)
        self.count = 0
        """Intervals added so far (not only those remembered)."""

    def add(self, seconds: float) -> None:
        """One step interval; a non-finite or non-positive value is ignored."""
        if math.isfinite(seconds) and seconds > 0:
            self._recent.append(seconds)
            self.count += 1

    def longest(self) -> float | None:
        return max(self._recent) if self._recent else None

    def timeout(self) -> float:
        m = self.model
        longest = self.longest() or 0.0
        timeout = max(m.floor_seconds, m.multiplier * longest)
        if self.count < m.warmup_samples:
            timeout = max(timeout, m.warmup_seconds)
        return timeout


@dataclass(frozen=True)
class FalseHang:
    """A healthy interval longer than the timeout in force when it began."""

    index: int
    """Position of the interval in the series (0: between the first and second step end)."""
    interval_seconds: float
    timeout_seconds: float


def replay(step_ends: Sequence[float], model: TimeoutModel) -> tuple[list[FalseHang], float]:
    """Replay one rank's step end times (seconds, ascending) through ``model`` as the watchdog sees them:
    each interval is judged against the timeout learned from the intervals before it, then learned. Every
    interval longer than its timeout would have been called a hang had the rank been waiting meanwhile (the
    strictest reading). Returns (the false hangs, the smallest margin: timeout / interval, over the series)."""
    intervals = StepIntervals(model)
    found: list[FalseHang] = []
    margin = math.inf
    for i, (a, b) in enumerate(itertools.pairwise(step_ends)):
        gap = b - a
        timeout = intervals.timeout()
        if gap > 0:
            margin = min(margin, timeout / gap)
        if gap > timeout:
            found.append(FalseHang(i, gap, timeout))
        intervals.add(gap)
    return found, margin
