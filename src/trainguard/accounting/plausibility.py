"""Plausibility of event records: which ones parse but cannot be true, and why.

One corrupt number must not rewrite the goodput headline, so `judge_records` leaves such records out
of the accounting and says which rule each broke (docs/goodput.md lists the rules).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainguard.core.clocks import estimate_offsets, reference_host
from trainguard.core.events import (
    NODE_FAULT_RANK,
    AttemptStarted,
    Event,
    FaultInjected,
    RunEnded,
    RunStarted,
    StepCompleted,
    StepSpan,
    final_run_end,
)
from trainguard.core.rundir import LoadedEvent

log = logging.getLogger(__name__)

# An attempt of 10**9 once made every step "lost progress"; a duration of -1e9 stretched a step
# block. Each limit below is far from anything a real or simulated run writes.

MAX_WORLD_SIZE = 10_000_000
"""Largest world size, node count or rank number believed: far beyond any cluster built."""
MAX_STEPS_PER_SECOND = 1e6
"""A `StepSpan` claiming more steps per second than this is corrupt."""
ATTEMPT_SLACK = 10
"""Without usable ``attempt_started`` records, attempt numbers beyond (attempts seen + this) are corrupt."""
STEP_FACTOR, STEP_SLACK = 2, 1000
"""A step beyond ``STEP_FACTOR * reference + STEP_SLACK`` is corrupt; the reference is the second
highest step number of the run (or ``target_steps`` if higher)."""
TIME_MARGIN_FACTOR, TIME_MARGIN_FLOOR_SECONDS = 3.0, 3600.0
"""A time further than ``max(FACTOR * core span, FLOOR)`` outside the core span of the run's record
times (all times but the earliest and latest 2%, at least one each side) is corrupt."""
DURATION_SLACK_SECONDS = 1.0
"""A duration may exceed the run's wall time by this much (clock skew) before it is corrupt."""
_DURATIONS = ("duration_seconds", "blocking_seconds", "total_seconds", "seconds", "detection_latency_seconds")
_COUNTS = ("attempt", "rank", "step", "first_step", "last_step", "resume_step", "completed_steps", "target_steps")
_SIZES = ("world_size", "nnodes", "rank")

Rule = Callable[[Event], "str | None"]
"""What is wrong with one record under a rule, or None when nothing is."""


@dataclass(frozen=True)
class ExcludedRecord:
    """A record that parsed but cannot be true, left out of the accounting (docs/goodput.md)."""

    writer: str
    """Event file name without ``.jsonl``."""
    line: int
    """Line in that file (0 when the record did not come from a file)."""
    type: str
    """The record's type (``step_completed``, ...)."""
    reason: str
    """Which rule it broke, with the offending value."""

    def __str__(self) -> str:
        return f"{self.writer}:{self.line}: {self.type}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {"writer": self.writer, "line": self.line, "type": self.type, "reason": self.reason}


_CHECKED: dict[type, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {}


def _checked_fields(cls: type[Event]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The duration, count and size fields a record type has (worked out once per type: this runs per record)."""
    found = _CHECKED.get(cls)
    if found is None:
        names = {f.name for f in dataclasses.fields(cls)}
        found = _CHECKED[cls] = (tuple(n for n in _DURATIONS if n in names), tuple(n for n in _COUNTS if n in names),
                                 tuple(n for n in _SIZES if n in names))
    return found


def intrinsic_problem(e: Event) -> str | None:
    """What is wrong with a record on its own, if anything."""
    durations, counts, sizes = _checked_fields(type(e))
    for name in durations:
        v = getattr(e, name, None)
        if isinstance(v, (int, float)) and v < 0:
            return f"negative {name} ({v:g})"
    for name in counts:
        v = getattr(e, name, None)
        if isinstance(v, int) and v < 0 and not (isinstance(e, FaultInjected) and name == "rank"
                                                 and v == NODE_FAULT_RANK):
            return f"negative {name} ({v})"
    for name in sizes:
        v = getattr(e, name, None)
        if isinstance(v, int) and v > MAX_WORLD_SIZE:
            return f"{name} {v} beyond {MAX_WORLD_SIZE:,}"
    if isinstance(e, StepSpan):
        n = e.last_step - e.first_step + 1
        if n < 1:
            return f"last_step {e.last_step} before first_step {e.first_step}"
        if n > 1 and n > e.duration_seconds * MAX_STEPS_PER_SECOND:
            return f"{n} steps in {e.duration_seconds:g} s (more than {MAX_STEPS_PER_SECOND:g} steps per second)"
    return None


def _attempt(e: Event) -> int | None:
    value = getattr(e, "attempt", None)
    return value if isinstance(value, int) else None


def _attempt_rule(records: list[Event]) -> Rule:
    """Only the agent starts attempts, and it numbers them 0, 1, 2, ...: later numbers are corrupt."""
    started = {e.attempt for e in records if isinstance(e, AttemptStarted)}
    started_cap = len(started) + ATTEMPT_SLACK
    believed = {a for a in started if a <= started_cap}
    if believed:
        last = max(believed)

        def never_started(e: Event) -> str | None:
            a = _attempt(e)
            if isinstance(e, AttemptStarted) and a is not None and a > started_cap:
                return f"attempt {a} far beyond the {len(started)} attempts started"
            if a is not None and a > last:
                return f"attempt {a} was never started (the last attempt_started is for attempt {last})"
            return None

        return never_started
    seen = {a for a in (_attempt(e) for e in records) if a is not None}
    cap = len(seen) + ATTEMPT_SLACK

    def far_beyond_seen(e: Event) -> str | None:
        a = _attempt(e)
        return f"attempt {a} far beyond the {len(seen)} attempts seen" if a is not None and a > cap else None

    return far_beyond_seen


def _top_step(e: Event) -> int:
    return e.step if isinstance(e, StepCompleted) else e.last_step if isinstance(e, StepSpan) else 0


def _step_rule(records: list[Event]) -> Rule | None:
    """Executed step numbers climb from 1: one far beyond all the others is corrupt."""
    tops = sorted({_top_step(e) for e in records if isinstance(e, (StepCompleted, StepSpan))})
    if len(tops) < 2:
        return None
    target = max((e.target_steps or 0 for e in records if isinstance(e, RunStarted)), default=0)
    limit = STEP_FACTOR * max(tops[-2], target) + STEP_SLACK

    def absurd_step(e: Event) -> str | None:
        top = _top_step(e)
        return f"step {top} absurdly beyond the others (next highest: {tops[-2]})" if top > limit else None

    return absurd_step


def _time_rule(records: list[Event]) -> Rule | None:
    """On the reference clock, a time far outside the span of the bulk of the run's records is corrupt."""
    if len(records) < 4:
        return None
    offsets = estimate_offsets(records, reference_host(records))
    times = sorted(e.time - offsets[e.host] for e in records)
    k = max(1, len(times) // 50)
    core_lo, core_hi = times[k], times[-1 - k]
    margin = max(TIME_MARGIN_FACTOR * (core_hi - core_lo), TIME_MARGIN_FLOOR_SECONDS)

    def far_off_time(e: Event) -> str | None:
        when = e.time - offsets[e.host]
        off = core_lo - when if when < core_lo else when - core_hi
        return f"time {e.time:.3f} lies {off:.0f} s outside the span of the run's records" if off > margin else None

    return far_off_time


def run_bounds(records: list[Event], at: Callable[[Event], float]) -> tuple[float, float]:
    """The run's span before step starts are known: run_started (else the first record) to run_ended
    (else the last record), on the clock ``at`` reads."""
    run_started = next((e for e in records if isinstance(e, RunStarted)), None)
    run_ended = final_run_end(records)  # the last one: a requeued job has one per allocation
    lo = at(run_started) if run_started else min(at(e) for e in records)
    hi = at(run_ended) if run_ended else max(at(e) for e in records)
    return lo, hi


class _Judge:
    """Applies rules one after the other, each to the records the earlier ones kept."""

    def __init__(self, loaded: list[LoadedEvent]) -> None:
        self.items = loaded
        self.excluded: list[ExcludedRecord] = []

    @property
    def records(self) -> list[Event]:
        return [item.record for item in self.items]

    def apply(self, rule: Rule | None) -> None:
        if rule is None:
            return
        kept = []
        for item in self.items:
            reason = rule(item.record)
            if reason is None:
                kept.append(item)
            else:
                self.excluded.append(ExcludedRecord(item.writer, item.line, item.record.TYPE, reason))
        self.items = kept


def _apply_span_rules(judge: _Judge) -> None:
    """The run's end before its start, then durations longer than the whole run."""
    records = judge.records
    if not records:
        return
    offsets = estimate_offsets(records, reference_host(records))

    def at(e: Event) -> float:
        return e.time - offsets[e.host]

    start = next((e for e in records if isinstance(e, RunStarted)), None)
    if start is not None:
        judge.apply(lambda e: "ends before the run started" if isinstance(e, RunEnded) and at(e) < at(start) else None)
    lo, hi = run_bounds(judge.records, at)
    wall = hi - lo

    def longer_than_run(e: Event) -> str | None:
        for name in _DURATIONS:
            v = getattr(e, name, None)
            if isinstance(v, (int, float)) and v > wall + DURATION_SLACK_SECONDS:
                return f"{name} {v:g} s longer than the whole run ({wall:.3f} s)"
        return None

    judge.apply(longer_than_run)


def judge_records(loaded: list[LoadedEvent]) -> tuple[list[LoadedEvent], list[ExcludedRecord]]:
    """Split records into the plausible ones and the excluded ones (with the rule each broke)."""
    judge = _Judge(loaded)
    judge.apply(intrinsic_problem)
    judge.apply(_attempt_rule(judge.records))
    judge.apply(_step_rule(judge.records))
    judge.apply(_time_rule(judge.records))
    _apply_span_rules(judge)
    return judge.items, judge.excluded
