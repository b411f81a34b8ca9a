"""Calibration of the simulator's job and policy from a real run directory's events.

Measures the step time, checkpoint stall and total save time, restore time, relaunch gap and the
restart overhead (failure detection to the first step of the next attempt), each as a median.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainguard.errors import InputError
from trainguard.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointLoaded,
    CheckpointSaveFinished,
    FailureDetected,
    StepCompleted,
    StepSpan,
)
from trainguard.rundir import RunDir


@dataclass(frozen=True)
class Calibration:
    """Medians measured from a run; None where the run has no sample of that kind."""

    run: str
    step_seconds: float | None
    checkpoint_stall_seconds: float | None
    checkpoint_total_seconds: float | None
    restore_seconds: float | None
    relaunch_seconds: float | None
    restart_overhead_seconds: float | None
    """Failure detection (or end of a failed attempt) to the first step start of the next attempt."""
    samples: dict[str, int]
    """How many measurements each figure is the median of."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def calibrate_from_run(path: str | Path) -> Calibration:
    """Read a run directory's events (RunDir.load) and measure the simulator's inputs."""
    events = [e.record for e in RunDir(path).load()]
    steps: list[float] = []
    stalls: list[float] = []
    totals: list[float] = []
    restores: list[float] = []
    first_step_start: dict[int, float] = {}
    attempt_start: dict[int, float] = {}
    failed_at: dict[int, float] = {}
    for ev in events:
        if isinstance(ev, StepCompleted):
            steps.append(ev.duration_seconds)
            begin = ev.time - ev.duration_seconds
        elif isinstance(ev, StepSpan):
            count = ev.last_step - ev.first_step + 1
            if count > 0:
                steps.append(ev.duration_seconds / count)
            begin = ev.time - ev.duration_seconds
        elif isinstance(ev, CheckpointSaveFinished):
            if ev.ok:
                stalls.append(ev.blocking_seconds)
                totals.append(ev.total_seconds)
            continue
        elif isinstance(ev, CheckpointLoaded):
            restores.append(ev.seconds)
            continue
        elif isinstance(ev, AttemptStarted):
            attempt_start[ev.attempt] = min(ev.time, attempt_start.get(ev.attempt, ev.time))
            continue
        elif isinstance(ev, FailureDetected):
            failed_at[ev.attempt] = min(ev.time, failed_at.get(ev.attempt, ev.time))
            continue
        elif isinstance(ev, AttemptEnded) and ev.reason == "failure":
            failed_at.setdefault(ev.attempt, ev.time)
            continue
        else:
            continue
        attempt = ev.attempt
        first_step_start[attempt] = min(begin, first_step_start.get(attempt, begin))
    relaunch: list[float] = []
    overhead: list[float] = []
    for attempt, t_fail in failed_at.items():
        nxt = attempt + 1
        if nxt in attempt_start:
            relaunch.append(max(attempt_start[nxt] - t_fail, 0.0))
        if nxt in first_step_start:
            overhead.append(max(first_step_start[nxt] - t_fail, 0.0))
    if not steps:
        raise InputError(f"{path}: the run has no completed steps to calibrate from")
    per_rank_steps: dict[int, int] = defaultdict(int)
    for ev in events:
        if isinstance(ev, (StepCompleted, StepSpan)):
            per_rank_steps[ev.rank] += 1
    return Calibration(
        run=str(path),
        step_seconds=_median(steps),
        checkpoint_stall_seconds=_median(stalls),
        checkpoint_total_seconds=_median(totals),
        restore_seconds=_median(restores),
        relaunch_seconds=_median(relaunch),
        restart_overhead_seconds=_median(overhead),
        samples={"steps": len(steps), "saves": len(stalls), "restores": len(restores),
                 "restarts": len(overhead), "ranks": len(per_rank_steps)},
    )
