"""Goodput accounting: effective training time (ETTR) and where every other second went.

The wall time of a run (RunStarted to RunEnded) is cut into labeled intervals built from the events;
where intervals overlap the label with the highest priority wins, and uncovered time is ``other``.
So productive time and the badput buckets add up to the wall time by construction. See
docs/goodput.md for the rules and the mapping to Google's ml-goodput-measurement buckets.
"""

from __future__ import annotations

import heapq
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from trainguard.clocks import estimate_offsets, reference_host
from trainguard.errors import InputError
from trainguard.eventlog import SkippedRecord, SkippedRecords, read_run
from trainguard.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointLoaded,
    CheckpointSaveFinished,
    CheckpointSaveStarted,
    Diagnosis,
    Event,
    FailureDetected,
    PlannedInterruption,
    RunEnded,
    RunStarted,
    StepCompleted,
    StepSpan,
)
from trainguard.rundir import LoadedEvent, RunDir

log = logging.getLogger(__name__)

PRODUCTIVE = "productive"
# Badput buckets, in priority order: where intervals overlap, the earlier label wins.
BUCKETS = ("checkpoint_save", "checkpoint_restore", "lost_progress", "detection", "startup", "restart", "straggler",
           "other")
# ``straggler`` outranks productive: it is the part of kept steps a named slow rank added (trainguard.stragglers).
_PRIORITY = ("checkpoint_save", "checkpoint_restore", "straggler", PRODUCTIVE, "lost_progress", "detection", "startup",
             "restart")
_RANK = {label: i for i, label in enumerate(_PRIORITY)}


@dataclass(frozen=True)
class Interruption:
    """One failure or planned interruption and what it cost."""

    time_seconds: float
    """When it was detected, seconds since the run started."""
    attempt: int
    kind: str
    planned: bool
    step: int | None
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    detection_latency_seconds: float
    category: str
    group: str
    culprit_ranks: tuple[int, ...]
    culprit_hosts: tuple[str, ...]
    verdict: str
    time_lost_seconds: float
    """Lost progress + detection + restart gap of this attempt, plus start-up and restore of the next."""


LISTED = 100
"""Skipped and excluded records listed one by one in a report; beyond that only counted."""


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


@dataclass(frozen=True)
class GoodputReport:
    """Everything `trainguard report` shows about one run."""

    run_id: str
    status: str
    synthetic: bool
    wall_seconds: float
    productive_seconds: float
    badput_seconds: dict[str, float]
    attempts: int
    completed_steps: int
    target_steps: int | None
    interruptions: list[Interruption]
    steps_per_second: list[tuple[float, float]]
    """(seconds since start, steps completed per second in the bin starting there)."""
    root_causes: list[dict[str, Any]]
    clock_offsets_seconds: dict[str, float]
    warnings: list[str] = field(default_factory=list)
    skipped_records: list[SkippedRecord] = field(default_factory=list)
    """Records the reader could not use (torn, not JSON, wrong field types), the first `LISTED` of them."""
    skipped_records_total: int = 0
    """How many records were skipped in all."""
    excluded_records: list[ExcludedRecord] = field(default_factory=list)
    """Readable but implausible records left out of the accounting, the first `LISTED` of them."""
    excluded_records_total: int = 0
    """How many records were excluded in all."""

    @property
    def ettr(self) -> float:
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "synthetic": self.synthetic,
            "ettr": self.ettr,
            "wall_seconds": self.wall_seconds,
            "productive_seconds": self.productive_seconds,
            "badput_seconds": dict(self.badput_seconds),
            "attempts": self.attempts,
            "completed_steps": self.completed_steps,
            "target_steps": self.target_steps,
            "interruptions": [
                {**i.__dict__, "ranks": list(i.ranks), "hosts": list(i.hosts),
                 "culprit_ranks": list(i.culprit_ranks), "culprit_hosts": list(i.culprit_hosts)}
                for i in self.interruptions
            ],
            "steps_per_second": [{"t_seconds": t, "steps_per_second": r} for t, r in self.steps_per_second],
            "root_causes": self.root_causes,
            "clock_offsets_seconds": self.clock_offsets_seconds,
            "warnings": self.warnings,
            "skipped_records": [r.to_json() for r in self.skipped_records],
            "skipped_records_total": self.skipped_records_total,
            "excluded_records": [r.to_json() for r in self.excluded_records],
            "excluded_records_total": self.excluded_records_total,
        }


@dataclass
class _Block:
    """Consecutive steps of one attempt, merged across ranks."""

    attempt: int
    first: int
    last: int
    start: float
    end: float


def _blocks(records: list[Event], shift: dict[str, float]) -> list[_Block]:
    merged: dict[tuple[int, int, int], _Block] = {}
    for e in records:
        if isinstance(e, StepCompleted):
            key, dur = (e.attempt, e.step, e.step), e.duration_seconds
        elif isinstance(e, StepSpan):
            key, dur = (e.attempt, e.first_step, e.last_step), e.duration_seconds
        else:
            continue
        end = e.time - shift[e.host]
        b = merged.get(key)
        if b is None:
            merged[key] = _Block(key[0], key[1], key[2], end - dur, end)
        else:
            b.start, b.end = min(b.start, end - dur), max(b.end, end)
    return sorted(merged.values(), key=lambda b: (b.start, b.attempt, b.first))


def _sweep(intervals: list[tuple[float, float, str, int]], lo: float, hi: float) -> dict[tuple[str, int], float]:
    """Seconds per (label, owner attempt) after resolving overlaps by priority; gaps are ``other``."""
    points: list[tuple[float, int, str, int]] = []
    for start, end, label, owner in intervals:
        start, end = max(start, lo), min(end, hi)
        if end > start:
            points.append((start, 1, label, owner))
            points.append((end, -1, label, owner))
    points.sort(key=lambda p: p[0])
    active: dict[tuple[str, int], int] = defaultdict(int)
    heap: list[tuple[int, int, str]] = []  # (priority, owner, label), lazily cleaned
    out: dict[tuple[str, int], float] = defaultdict(float)
    t = lo
    for when, delta, label, owner in [*points, (hi, 0, "", -1)]:
        if when > t:
            while heap and active[(heap[0][2], heap[0][1])] == 0:
                heapq.heappop(heap)
            top = (heap[0][2], heap[0][1]) if heap else ("other", -1)
            out[top] += when - t
            t = when
        if delta:
            active[(label, owner)] += delta
            if delta > 0:
                heapq.heappush(heap, (_RANK[label], owner, label))
    return out


# --- plausibility: records that parse but cannot be true ------------------------------------------
#
# One corrupt number must not rewrite the headline (an attempt of 10**9 made every step "lost
# progress"; a duration of -1e9 stretched a step block). Such records are left out of the accounting
# and listed in the report. The rules are documented in docs/goodput.md; each is far from anything a
# real or simulated run writes.

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


def _intrinsic_problem(e: Event) -> str | None:
    """What is wrong with a record on its own, if anything."""
    for name in _DURATIONS:
        v = getattr(e, name, None)
        if isinstance(v, (int, float)) and v < 0:
            return f"negative {name} ({v:g})"
    for name in _COUNTS:
        v = getattr(e, name, None)
        if isinstance(v, int) and v < 0:
            return f"negative {name} ({v})"
    for name in _SIZES:
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


def _bounds(records: list[Event], t: Any) -> tuple[float, float]:
    """The run's span before step starts are known: run_started (else the first record) to run_ended
    (else the last record)."""
    run_started = next((e for e in records if isinstance(e, RunStarted)), None)
    run_ended = next((e for e in records if isinstance(e, RunEnded)), None)
    lo = t(run_started) if run_started else min(t(e) for e in records)
    hi = t(run_ended) if run_ended else max(t(e) for e in records)
    return lo, hi


def judge_records(loaded: list[LoadedEvent]) -> tuple[list[LoadedEvent], list[ExcludedRecord]]:
    """Split records into the plausible ones and the excluded ones (with the rule each broke)."""
    excluded: list[ExcludedRecord] = []

    def keep_if(items: list[LoadedEvent], why: Any) -> list[LoadedEvent]:
        kept = []
        for item in items:
            reason = why(item.record)
            if reason is None:
                kept.append(item)
            else:
                excluded.append(ExcludedRecord(item.writer, item.line, item.record.TYPE, reason))
        return kept

    items = keep_if(loaded, _intrinsic_problem)

    # Attempts: only the agent starts attempts, and it numbers them 0, 1, 2, ...
    started = {e.attempt for e in (i.record for i in items) if isinstance(e, AttemptStarted)}
    started_cap = len(started) + ATTEMPT_SLACK
    believed = {a for a in started if a <= started_cap}
    if believed:
        last = max(believed)

        def bad_attempt(e: Event) -> str | None:
            a = _attempt(e)
            if isinstance(e, AttemptStarted) and a is not None and a > started_cap:
                return f"attempt {a} far beyond the {len(started)} attempts started"
            if a is not None and a > last:
                return f"attempt {a} was never started (the last attempt_started is for attempt {last})"
            return None
    else:
        seen = {a for a in (_attempt(i.record) for i in items) if a is not None}
        cap = len(seen) + ATTEMPT_SLACK

        def bad_attempt(e: Event) -> str | None:
            a = _attempt(e)
            return f"attempt {a} far beyond the {len(seen)} attempts seen" if a is not None and a > cap else None

    items = keep_if(items, bad_attempt)

    # Steps: executed step numbers climb from 1; one far beyond all the others is corrupt.
    tops = sorted({e.step for e in (i.record for i in items) if isinstance(e, StepCompleted)}
                  | {e.last_step for e in (i.record for i in items) if isinstance(e, StepSpan)})
    if len(tops) >= 2:
        target = max((e.target_steps or 0 for e in (i.record for i in items) if isinstance(e, RunStarted)), default=0)
        limit = STEP_FACTOR * max(tops[-2], target) + STEP_SLACK

        def bad_step(e: Event) -> str | None:
            top = e.step if isinstance(e, StepCompleted) else e.last_step if isinstance(e, StepSpan) else 0
            return f"step {top} absurdly beyond the others (next highest: {tops[-2]})" if top > limit else None

        items = keep_if(items, bad_step)

    # Times: on the reference clock, far outside the span of the bulk of the run's records.
    records = [i.record for i in items]
    if len(records) >= 4:
        offsets = estimate_offsets(records, reference_host(records))
        times = sorted(e.time - offsets[e.host] for e in records)
        k = max(1, len(times) // 50)
        core_lo, core_hi = times[k], times[-1 - k]
        margin = max(TIME_MARGIN_FACTOR * (core_hi - core_lo), TIME_MARGIN_FLOOR_SECONDS)

        def bad_time(e: Event) -> str | None:
            when = e.time - offsets[e.host]
            off = core_lo - when if when < core_lo else when - core_hi
            return f"time {e.time:.3f} lies {off:.0f} s outside the span of the run's records" if off > margin else None

        items = keep_if(items, bad_time)

    # The run's end before its start, and durations longer than the whole run.
    records = [i.record for i in items]
    if records:
        offsets = estimate_offsets(records, reference_host(records))

        def t(e: Event) -> float:
            return e.time - offsets[e.host]

        start = next((e for e in records if isinstance(e, RunStarted)), None)
        if start is not None:
            items = keep_if(items, lambda e: "ends before the run started"
                            if isinstance(e, RunEnded) and t(e) < t(start) else None)
            records = [i.record for i in items]
        lo, hi = _bounds(records, t)
        wall = hi - lo

        def too_long(e: Event) -> str | None:
            for name in _DURATIONS:
                v = getattr(e, name, None)
                if isinstance(v, (int, float)) and v > wall + DURATION_SLACK_SECONDS:
                    return f"{name} {v:g} s longer than the whole run ({wall:.3f} s)"
            return None

        items = keep_if(items, too_long)
    return items, excluded


def compute_goodput(run: RunDir | str | os.PathLike[str] | list[LoadedEvent]) -> GoodputReport:
    """Account for the wall time of a run from its events.

    Unusable records (torn, not JSON, wrong types) are skipped by the reader and implausible ones are
    excluded (`judge_records`); both are listed in the report and counted in its warnings.
    """
    skipped = SkippedRecords(keep=LISTED)
    root = None
    if isinstance(run, list):
        loaded, run_id = run, ""
    else:
        rd = run if isinstance(run, RunDir) else RunDir(run)
        root = rd.root
        loaded = [LoadedEvent(writer, line, record) for writer, line, record in read_run(rd.root, skipped=skipped)]
        run_id = rd.run_id
    loaded, excluded = judge_records(loaded)
    if not loaded:
        example = f", first: {excluded[0]}" if excluded else ""
        raise InputError(f"{run_id or 'run'}: no plausible events ({len(excluded)} excluded{example})")
    records = [item.record for item in loaded]
    warnings: list[str] = []
    if skipped.total:
        warnings.append(f"{skipped.total} unreadable record(s) skipped (first: {skipped.items[0]}); "
                        "see skipped_records")
    if excluded:
        warnings.append(f"{len(excluded)} implausible record(s) excluded from the accounting "
                        f"(first: {excluded[0]}); see excluded_records")
    ref = reference_host(records)
    offsets = estimate_offsets(records, ref)
    for host, off in offsets.items():
        if abs(off) > 1.0:
            warnings.append(f"clock of host {host!r} is {off:+.3f} s off the reference host {ref!r}; corrected")

    def t(e: Event) -> float:
        return e.time - offsets[e.host]

    run_started = next((e for e in records if isinstance(e, RunStarted)), None)
    run_ended = next((e for e in records if isinstance(e, RunEnded)), None)
    blocks = _blocks(records, offsets)
    all_times = [t(e) for e in records] + [b.start for b in blocks]
    lo = t(run_started) if run_started else min(all_times)
    hi = t(run_ended) if run_ended else max(t(e) for e in records)
    if run_ended is None:
        warnings.append("the run has no run_ended record: accounted up to its last event")
    if run_id == "" and run_started:
        run_id = run_started.run_id

    attempt_start: dict[int, float] = {}
    attempt_end: dict[int, float] = {}
    attempt_reason: dict[int, str] = {}
    failures: dict[int, list[FailureDetected]] = defaultdict(list)
    planned: dict[int, PlannedInterruption] = {}
    diagnoses: dict[int, Diagnosis] = {}
    save_starts: dict[tuple[int, int, int], float] = {}
    for e in records:
        if isinstance(e, AttemptStarted):
            attempt_start[e.attempt] = t(e)
        elif isinstance(e, AttemptEnded):
            attempt_end[e.attempt], attempt_reason[e.attempt] = t(e), e.reason
        elif isinstance(e, FailureDetected):
            failures[e.attempt].append(e)
        elif isinstance(e, PlannedInterruption):
            planned[e.attempt] = e
        elif isinstance(e, Diagnosis):
            if e.attempt not in diagnoses or e.confidence > diagnoses[e.attempt].confidence:
                diagnoses[e.attempt] = e
        elif isinstance(e, CheckpointSaveStarted):
            save_starts[(e.attempt, e.rank, e.step)] = t(e)
    attempts = sorted(set(attempt_start) | {b.attempt for b in blocks} | set(failures) | set(attempt_end))
    if not attempts:
        attempts = [0]
    for a in attempts:  # runs without a supervisor have no attempt records
        attempt_start.setdefault(a, min([b.start for b in blocks if b.attempt == a], default=lo) if a else lo)

    # The first step each later attempt ran: earlier executions of that step onward were redone.
    first_step = {a: min((b.first for b in blocks if b.attempt == a), default=None) for a in attempts}
    redo_from: dict[int, float] = {}
    for a in attempts:
        later = [s for b, s in first_step.items() if b > a and s is not None]
        redo_from[a] = min(later) if later else float("inf")

    def onset(a: int) -> float | None:
        if failures[a]:
            return min(t(f) - f.detection_latency_seconds for f in failures[a])
        if a in planned:
            return t(planned[a])
        return attempt_end.get(a) if attempt_reason.get(a) == "failure" else None

    # Start-up and restore of an attempt are the cost of the interruption that ended the one before.
    previous = {a: (attempts[i - 1] if i else -1) for i, a in enumerate(attempts)}
    iv: list[tuple[float, float, str, int]] = []
    completed = 0
    for b in blocks:
        n = b.last - b.first + 1
        kept = max(0, min(n, int(min(redo_from[b.attempt], b.last + 1) - b.first)))
        cut = b.start + (b.end - b.start) * kept / n
        if kept:
            iv.append((b.start, cut, PRODUCTIVE, b.attempt))
            completed = max(completed, b.first + kept - 1)
        if kept < n:
            iv.append((cut, b.end, "lost_progress", b.attempt))
    for a in attempts:
        lost = [b.start + (b.end - b.start) * max(0, redo_from[a] - b.first) / (b.last - b.first + 1)
                for b in blocks if b.attempt == a and b.last >= redo_from[a]]
        o = onset(a)
        if lost and o is not None:
            iv.append((min(lost), o, "lost_progress", a))
        for f in failures[a]:
            iv.append((t(f) - f.detection_latency_seconds, t(f), "detection", a))
        first_start = min((b.start for b in blocks if b.attempt == a), default=None)
        startup_end = first_start if first_start is not None else (o if o is not None else attempt_end.get(a, hi))
        begin = lo if a == attempts[0] else attempt_start[a]
        iv.append((begin, startup_end, "startup", previous[a]))
        nxt = [b for b in attempts if b > a]
        if nxt:
            detected = [t(f) for f in failures[a]]
            gap_from = min(detected) if detected else attempt_end.get(a, o if o is not None else attempt_start[nxt[0]])
            iv.append((gap_from, attempt_start[nxt[0]], "restart", a))
    iv.extend(_straggler_intervals(records, root, redo_from))
    for e in records:
        if isinstance(e, CheckpointSaveFinished):
            start = save_starts.get((e.attempt, e.rank, e.step), t(e) - e.total_seconds)
            iv.append((start, start + e.blocking_seconds, "checkpoint_save", e.attempt))
        elif isinstance(e, CheckpointLoaded):
            iv.append((t(e) - e.seconds, t(e), "checkpoint_restore", previous.get(e.attempt, -1)))

    spent = _sweep(iv, lo, hi)
    by_label: dict[str, float] = defaultdict(float)
    by_owner: dict[int, float] = defaultdict(float)
    for (label, owner), secs in spent.items():
        by_label[label] += secs
        if label not in (PRODUCTIVE, "other", "checkpoint_save", "straggler"):
            by_owner[owner] += secs

    interruptions: list[Interruption] = []
    for a in attempts:
        d = diagnoses.get(a)
        if failures[a]:  # one interruption per attempt: the first failure seen ends it
            first = min(failures[a], key=t)
            interruptions.append(Interruption(
                time_seconds=t(first) - lo, attempt=a, kind=first.kind, planned=False, step=first.step,
                ranks=first.ranks, hosts=first.hosts, detection_latency_seconds=first.detection_latency_seconds,
                category=d.category if d else "Unknown", group=d.group if d else "Unknown",
                culprit_ranks=d.culprit_ranks if d else (), culprit_hosts=d.culprit_hosts if d else (),
                verdict=d.verdict if d else "", time_lost_seconds=by_owner.get(a, 0.0),
            ))
        elif a in planned:
            interruptions.append(Interruption(
                time_seconds=t(planned[a]) - lo, attempt=a, kind="planned", planned=True, step=None, ranks=(),
                hosts=(), detection_latency_seconds=0.0, category="Planned", group="Planned", culprit_ranks=(),
                culprit_hosts=(), verdict="", time_lost_seconds=by_owner.get(a, 0.0),
            ))

    return GoodputReport(
        run_id=run_id,
        status=run_ended.status if run_ended else "incomplete",
        synthetic=bool(run_started and run_started.synthetic),
        wall_seconds=hi - lo,
        productive_seconds=by_label[PRODUCTIVE],
        badput_seconds={k: by_label[k] for k in BUCKETS},
        attempts=len(attempts),
        completed_steps=completed,
        target_steps=run_started.target_steps if run_started else None,
        interruptions=interruptions,
        steps_per_second=_throughput(blocks, lo, hi),
        root_causes=_root_causes(interruptions),
        clock_offsets_seconds={h: o for h, o in offsets.items() if o},
        warnings=warnings,
        skipped_records=list(skipped.items),
        skipped_records_total=skipped.total,
        excluded_records=excluded[:LISTED],
        excluded_records_total=len(excluded),
    )


def _straggler_intervals(records: list[Event], root: Any,
                         redo_from: dict[int, float]) -> list[tuple[float, float, str, int]]:
    """``[end - saved, end]`` of every kept step a named straggler slowed: the time it would not have taken."""
    from trainguard.stragglers import analyze, read_arrivals

    try:
        found = analyze(records, read_arrivals(root) if root is not None else None).stragglers
    except Exception as exc:  # the straggler bucket must never cost the rest of the report
        log.warning("straggler accounting skipped: %s", exc)
        return []
    return [(end - saved, end, "straggler", attempt) for s in found for attempt, step, end, saved in s.saved_by_step
            if saved > 0 and step < redo_from.get(attempt, float("inf"))]


def _throughput(blocks: list[_Block], lo: float, hi: float, bins: int = 60) -> list[tuple[float, float]]:
    """Executed steps per second in ``bins`` equal bins over the run (steps of a span spread evenly)."""
    if hi <= lo:
        return []
    width = (hi - lo) / bins
    counts = [0.0] * bins

    def bin_of(x: float) -> int:
        # Clamp before int(): with a tiny width the quotient can overflow to infinity.
        return int(min(max((x - lo) / width, -1.0), float(bins)))

    for b in blocks:
        n = b.last - b.first + 1
        i0, i1 = bin_of(b.start), bin_of(b.end)
        if b.end <= b.start:
            counts[min(max(i0, 0), bins - 1)] += n
            continue
        # Spread the block's steps over its interval, bin by bin.
        for i in range(max(i0, 0), min(i1, bins - 1) + 1):
            s, e = max(b.start, lo + i * width), min(b.end, lo + (i + 1) * width)
            counts[i] += n * max(e - s, 0.0) / (b.end - b.start)
    return [(i * width, c / width) for i, c in enumerate(counts)]


def _root_causes(interruptions: list[Interruption]) -> list[dict[str, Any]]:
    """Llama 3 Table 5 style: category, group, count, share of interruptions, time lost."""
    unexpected = [i for i in interruptions if not i.planned]
    rows: dict[tuple[str, str], list[Interruption]] = defaultdict(list)
    for i in unexpected:
        rows[(i.category, i.group)].append(i)
    table = [
        {"category": c, "group": g, "count": len(items), "share": len(items) / len(unexpected),
         "time_lost_seconds": sum(i.time_lost_seconds for i in items)}
        for (c, g), items in rows.items()
    ]
    return sorted(table, key=lambda r: (-r["count"], r["category"]))
