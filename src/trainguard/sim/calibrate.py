"""Calibration of the simulator's job and policy from a real run directory's events.

Measures the step time, checkpoint stall and total save time, restore time, relaunch gap and the
restart overhead (failure detection to the first step of the next attempt), each as a median; restarts
the supervisor recorded as in-process (``AttemptStarted.recovery``) are measured apart, and the
in-process outcomes (``inprocess_recovery`` records) give the share that did not fall back. The memory
tier's copies and restores (records with ``tier`` ``memory`` / ``peer``) are measured apart from
storage's, and so are full restarts whose attempt restored from memory or started warm interpreters.
"""

from __future__ import annotations

import json
import logging
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

log = logging.getLogger(__name__)

MEMORY_TIERS = ("memory", "peer")
"""``CheckpointLoaded.tier`` values of a restore the memory tier served."""


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
    memory_stall_seconds: float | None = None
    """Stall of a memory-tier copy (``checkpoint_save_finished`` with tier ``memory``, ok only)."""
    memory_total_seconds: float | None = None
    """A memory-tier copy's start until it was checksummed and replicated."""
    memory_replicated: bool = False
    """Whether the run's memory copies were replicated to a peer node (their path names one)."""
    memory_restore_seconds: float | None = None
    """Restore from this node's memory (``checkpoint_loaded`` with tier ``memory``)."""
    peer_restore_seconds: float | None = None
    """Restore from a peer node's replica (tier ``peer``)."""
    memory_restart_seconds: float | None = None
    """Full cold restarts whose attempt restored from the memory tier: detection to first step."""
    warm_restart_seconds: float | None = None
    """Full restarts whose attempt started warm interpreters (``attempt_started.warm_starts`` > 0)."""
    warm_start_seconds: float | None = None
    """Those warm restarts less their restore: relaunch + start-up, what the simulator's warm start is."""
    cold_start_seconds: float | None = None
    """Every cold full restart less its restore (relaunch + start-up), whatever tier restored it."""
    samples: dict[str, int] = field(default_factory=dict)
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
    memory_stalls: list[float] = field(default_factory=list)
    memory_totals: list[float] = field(default_factory=list)
    memory_replicated: bool = False
    tier_restores: dict[str, list[float]] = field(default_factory=dict)
    """Restore seconds by the memory tier's ``tier`` (``memory``, ``peer``)."""
    loaded: dict[int, tuple[str, float]] = field(default_factory=dict)
    """Attempt -> (tier its restore came from, its slowest rank's restore seconds)."""
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
            self.saved(ev)
        elif isinstance(ev, CheckpointLoaded):
            self.restored(ev)
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

    def saved(self, ev: CheckpointSaveFinished) -> None:
        if ev.tier == "memory":
            self.memory_stalls.append(ev.blocking_seconds)
            self.memory_totals.append(ev.total_seconds)
            self.memory_replicated = self.memory_replicated or "+peer:" in ev.path
        elif not ev.tier:  # storage; a peer's copy is never saved under its own record
            self.stalls.append(ev.blocking_seconds)
            self.totals.append(ev.total_seconds)

    def restored(self, ev: CheckpointLoaded) -> None:
        if ev.tier in MEMORY_TIERS:
            self.tier_restores.setdefault(ev.tier, []).append(ev.seconds)
        else:
            self.restores.append(ev.seconds)
        tier, seconds = self.loaded.get(ev.attempt, (ev.tier, 0.0))
        # one rank served by storage makes the attempt's restore a storage one (its slowest path)
        self.loaded[ev.attempt] = (tier if tier not in MEMORY_TIERS else ev.tier, max(seconds, ev.seconds))

    def restart_gaps(self, warm: set[int]) -> dict[str, list[float]]:
        """Failure to the next attempt's start (``relaunch``), and to its first step, by recovery path:
        ``full`` (cold, restored from storage or nothing), ``memory`` (cold, restored from the memory tier),
        ``warm``, ``inprocess``; ``warm_start`` and ``cold_start`` are the full restarts less their restore."""
        gaps: dict[str, list[float]] = {k: [] for k in ("relaunch", "full", "memory", "warm", "inprocess",
                                                        "warm_start", "cold_start")}
        for attempt, t_fail in self.failed_at.items():
            nxt = attempt + 1
            fast = nxt in self.inprocess_attempts
            if nxt in self.attempt_start and not fast:
                gaps["relaunch"].append(max(self.attempt_start[nxt] - t_fail, 0.0))
            if nxt not in self.first_step_start:
                continue
            gap = max(self.first_step_start[nxt] - t_fail, 0.0)
            tier, restore = self.loaded.get(nxt, ("", 0.0))
            if fast:
                gaps["inprocess"].append(gap)
            elif nxt in warm:
                gaps["warm"].append(gap)
                gaps["warm_start"].append(max(gap - restore, 0.0))
            else:
                gaps["memory" if tier in MEMORY_TIERS else "full"].append(gap)
                gaps["cold_start"].append(max(gap - restore, 0.0))
        return gaps


def warm_attempts(run: RunDir) -> set[int]:
    """Attempts whose ``attempt_started`` says some local ranks were warm interpreters (``warm_starts`` > 0).

    Read from the agents' raw records, so that runs whose records carry the field calibrate with it
    whether or not this reader's record type declares it (0 or absent: cold).
    """
    out: set[int] = set()
    for path in run.event_files():
        if not path.name.startswith("agent-") or not path.is_file():
            continue
        try:
            with path.open("rb") as f:
                for raw in f:
                    if b'"attempt_started"' in raw and b'"warm_starts"' in raw:
                        _warm_line(raw, out)
        except OSError as exc:
            log.warning("calibration: cannot read %s: %s", path, exc)
    return out


def _warm_line(raw: bytes, out: set[int]) -> None:
    try:
        record = json.loads(raw)
    except ValueError:
        return  # a torn line: the typed reader reports it
    if not isinstance(record, dict) or record.get("type") != "attempt_started":
        return
    attempt, warm = record.get("attempt"), record.get("warm_starts", 0)
    if isinstance(attempt, int) and isinstance(warm, int) and not isinstance(warm, bool) and warm > 0:
        out.add(attempt)


def calibrate_from_run(path: str | Path) -> Calibration:
    """Read a run directory's events (RunDir.load) and measure the simulator's inputs."""
    got = _Samples()
    run = RunDir(path)
    for loaded in run.load():
        got.add(loaded.record)
    if not got.steps:
        raise CalibrationError(f"{path}: the run has no completed steps to calibrate from")
    gaps = got.restart_gaps(warm_attempts(run))
    outcomes = got.inprocess_outcomes
    own, peer = got.tier_restores.get("memory", []), got.tier_restores.get("peer", [])
    return Calibration(
        run=str(path),
        step_seconds=_median(got.steps),
        checkpoint_stall_seconds=_median(got.stalls),
        checkpoint_total_seconds=_median(got.totals),
        restore_seconds=_median(got.restores),
        relaunch_seconds=_median(gaps["relaunch"]),
        restart_overhead_seconds=_median(gaps["full"]),
        inprocess_restart_seconds=_median(gaps["inprocess"]),
        inprocess_share=sum(outcomes) / len(outcomes) if outcomes else None,
        memory_stall_seconds=_median(got.memory_stalls),
        memory_total_seconds=_median(got.memory_totals),
        memory_replicated=got.memory_replicated,
        memory_restore_seconds=_median(own),
        peer_restore_seconds=_median(peer),
        memory_restart_seconds=_median(gaps["memory"]),
        warm_restart_seconds=_median(gaps["warm"]),
        warm_start_seconds=_median(gaps["warm_start"]),
        cold_start_seconds=_median(gaps["cold_start"]),
        samples={"steps": len(got.steps), "saves": len(got.stalls), "restores": len(got.restores),
                 "restarts": len(gaps["full"]), "inprocess_restarts": len(gaps["inprocess"]),
                 "inprocess_attempts": len(outcomes), "ranks": len(got.ranks),
                 "memory_saves": len(got.memory_stalls), "memory_restores": len(own), "peer_restores": len(peer),
                 "memory_restarts": len(gaps["memory"]), "warm_restarts": len(gaps["warm"])},
    )
