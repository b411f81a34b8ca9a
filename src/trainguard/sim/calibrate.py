"""Calibration of the simulator's job and policy from a real run directory's events.

Measures the step time, checkpoint stall and total save time, restore time, relaunch gap and the
restart overhead (failure detection to the first step of the next attempt), each as a median; restarts
the supervisor recorded as in-process (``AttemptStarted.recovery``) are measured apart, and the
in-process outcomes (``inprocess_recovery`` records) give the share that did not fall back.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointLoaded,
    CheckpointSaveFinished,
    FailureDetected,
    InProcessRecovery,
    StepCompleted,
    StepSpan,
)
from trainguard.core.rundir import RunDir
from trainguard.sim.errors import CalibrationError


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
    """Failure detection (or end of a failed attempt) to the first step start of the next attempt,
    full restarts only."""
    inprocess_restart_seconds: float | None
    """The same for attempts opened by an in-process restart."""
    inprocess_share: float | None
    """In-process recoveries that succeeded / all attempted (None: none attempted)."""
    samples: dict[str, int]
    """How many measurements each figure is the median of."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


@dataclass
class _Samples:
    """Measurements gathered while reading a run's events once."""

    steps: list[float] = field(default_factory=list)
    stalls: list[float] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    restores: list[float] = field(default_factory=list)
    first_step_start: dict[int, float] = field(default_factory=dict)
    """Attempt -> start of its first step."""
    attempt_start: dict[int, float] = field(default_factory=dict)
    failed_at: dict[int, float] = field(default_factory=dict)
    """Attempt -> its failure's detection (or the failed attempt's end)."""
    ranks: set[int] = field(default_factory=set)
    inprocess_attempts: set[int] = field(default_factory=set)
    """Attempts whose workers came up by an in-process restart."""
    inprocess_outcomes: list[bool] = field(default_factory=list)
    """One per in-process recovery: True when it did not fall back to a full restart."""

    def step(self, ev: StepCompleted | StepSpan) -> None:
        if isinstance(ev, StepSpan):
            count = ev.last_step - ev.first_step + 1
            if count > 0:
                self.steps.append(ev.duration_seconds / count)
        else:
            self.steps.append(ev.duration_seconds)
        self.ranks.add(ev.rank)
        begin = ev.time - ev.duration_seconds
        self.first_step_start[ev.attempt] = min(begin, self.first_step_start.get(ev.attempt, begin))

    def add(self, ev: object) -> None:
        if isinstance(ev, (StepCompleted, StepSpan)):
            self.step(ev)
        elif isinstance(ev, CheckpointSaveFinished) and ev.ok:
            self.stalls.append(ev.blocking_seconds)
            self.totals.append(ev.total_seconds)
        elif isinstance(ev, CheckpointLoaded):
            self.restores.append(ev.seconds)
        elif isinstance(ev, AttemptStarted):
            self.attempt_start[ev.attempt] = min(ev.time, self.attempt_start.get(ev.attempt, ev.time))
            if ev.recovery == "in-process":
                self.inprocess_attempts.add(ev.attempt)
        elif isinstance(ev, InProcessRecovery):
            self.inprocess_outcomes.append(ev.status == "recovered")
        elif isinstance(ev, FailureDetected):
            self.failed_at[ev.attempt] = min(ev.time, self.failed_at.get(ev.attempt, ev.time))
        elif isinstance(ev, AttemptEnded) and ev.reason == "failure":
            self.failed_at.setdefault(ev.attempt, ev.time)

    def restart_gaps(self) -> tuple[list[float], list[float], list[float]]:
        """(relaunch, full, in-process): failure to the next attempt's start, and to its first step."""
        relaunch: list[float] = []
        overhead: list[float] = []
        inprocess: list[float] = []
        for attempt, t_fail in self.failed_at.items():
            nxt = attempt + 1
            fast = nxt in self.inprocess_attempts
            if nxt in self.attempt_start and not fast:
                relaunch.append(max(self.attempt_start[nxt] - t_fail, 0.0))
            if nxt in self.first_step_start:
                (inprocess if fast else overhead).append(max(self.first_step_start[nxt] - t_fail, 0.0))
        return relaunch, overhead, inprocess


def calibrate_from_run(path: str | Path) -> Calibration:
    """Read a run directory's events (RunDir.load) and measure the simulator's inputs."""
    got = _Samples()
    for loaded in RunDir(path).load():
        got.add(loaded.record)
    if not got.steps:
        raise CalibrationError(f"{path}: the run has no completed steps to calibrate from")
    relaunch, overhead, inprocess = got.restart_gaps()
    outcomes = got.inprocess_outcomes
    return Calibration(
        run=str(path),
        step_seconds=_median(got.steps),
        checkpoint_stall_seconds=_median(got.stalls),
        checkpoint_total_seconds=_median(got.totals),
        restore_seconds=_median(got.restores),
        relaunch_seconds=_median(relaunch),
        restart_overhead_seconds=_median(overhead),
        inprocess_restart_seconds=_median(inprocess),
        inprocess_share=sum(outcomes) / len(outcomes) if outcomes else None,
        samples={"steps": len(got.steps), "saves": len(got.stalls), "restores": len(got.restores),
                 "restarts": len(overhead), "inprocess_restarts": len(inprocess),
                 "inprocess_attempts": len(outcomes), "ranks": len(got.ranks)},
    )
