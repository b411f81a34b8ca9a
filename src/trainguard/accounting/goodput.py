"""Goodput accounting: effective training time (ETTR) and where every other second went.

The wall time of a run (RunStarted to RunEnded) is cut into labeled intervals built from the events;
where intervals overlap the label with the highest priority wins, and uncovered time is ``other``.
So productive time and the badput buckets add up to the wall time by construction. See
docs/goodput.md for the rules and the mapping to Google's ml-goodput-measurement buckets.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import os
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainguard.accounting import resume
from trainguard.accounting.goodput_report import GoodputReport, Interruption, root_causes, throughput
from trainguard.accounting.plausibility import ExcludedRecord, judge_records
from trainguard.accounting.resume import AttemptSteps, ResumePoint, Scenario
from trainguard.accounting.stepfold import LISTED, STEP_RECORDS_KEPT, FoldedRun, FoldedSteps, fold_run
from trainguard.core.clocks import estimate_offsets, reference_host
from trainguard.core.eventlog import SkippedRecords
from trainguard.core.events import (
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
    final_run_end,
)
from trainguard.core.protocol import RunLayout
from trainguard.core.rundir import LoadedEvent, RunDir
from trainguard.errors import InputError

log = logging.getLogger(__name__)

__all__ = ["BUCKETS", "PRODUCTIVE", "ExcludedRecord", "GoodputReport", "Interruption", "compute_goodput",
           "judge_records"]

PRODUCTIVE = "productive"
# Badput buckets, in priority order: where intervals overlap, the earlier label wins.
BUCKETS = ("checkpoint_save", "checkpoint_restore", "lost_progress", "detection", "startup", "restart", "straggler",
           "other")
# ``straggler`` outranks productive: it is the part of kept steps a named slow rank added (trainguard.stragglers).
_PRIORITY = ("checkpoint_save", "checkpoint_restore", "straggler", PRODUCTIVE, "lost_progress", "detection", "startup",
             "restart")
_RANK = {label: i for i, label in enumerate(_PRIORITY)}


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


def _attempt_steps(records: list[Event], blocks: list[_Block]) -> list[AttemptSteps]:
    """Each attempt's recorded step range and the numbering of its steps (a framework's wins over the rest)."""
    numberings: dict[int, set[str]] = defaultdict(set)
    for record in records:
        if isinstance(record, StepCompleted):
            numberings[record.attempt].add(record.numbering)
        elif isinstance(record, FoldedSteps):
            numberings[record.attempt].update(record.numberings)
        elif isinstance(record, StepSpan):
            numberings[record.attempt].add("")
    ranges: dict[int, tuple[int, int]] = {}
    for b in blocks:
        lo, hi = ranges.get(b.attempt, (b.first, b.last))
        ranges[b.attempt] = (min(lo, b.first), max(hi, b.last))
    out = []
    for attempt, (lo, hi) in sorted(ranges.items()):
        seen = numberings.get(attempt, {""})
        numbering = next((n for n in ("framework", "script", "") if n in seen), min(seen))
        out.append(AttemptSteps(attempt, numbering, lo, hi))
    return out


def _shifted(blocks: list[_Block], shift: dict[int, int]) -> list[_Block]:
    """The blocks numbered as the run numbers its steps (each attempt's numbers plus its offset)."""
    return [_Block(b.attempt, b.first + shift.get(b.attempt, 0), b.last + shift.get(b.attempt, 0), b.start, b.end)
            for b in blocks]


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


Interval = tuple[float, float, str, int]
"""(start, end, label, owner attempt), seconds on the reference clock; the owner is the attempt whose
interruption the time is charged to (-1: none)."""


@dataclass(frozen=True)
class _ReferenceClock:
    """Record times moved onto the reference host's clock."""

    offsets: dict[str, float]
    """Seconds each host's clock runs ahead of the reference host's."""

    def at(self, record: Event) -> float:
        return record.time - self.offsets[record.host]


@dataclass(frozen=True)
class _Attempts:
    """What the records say about each attempt, times on the reference clock."""

    numbers: list[int]
    """Attempt numbers in order (``[0]`` for a run that has none)."""
    started: dict[int, float]
    """When each attempt started (for runs without a supervisor: its first step, or the run start)."""
    ended: dict[int, float]
    """When each attempt with an ``attempt_ended`` record ended."""
    end_reason: dict[int, str]
    """The ``reason`` of that record."""
    failures: dict[int, list[FailureDetected]]
    """Failures detected in each attempt."""
    planned: dict[int, PlannedInterruption]
    """The planned interruption that ended an attempt, if one did."""
    diagnoses: dict[int, Diagnosis]
    """The most confident diagnosis of each attempt."""
    save_starts: dict[tuple[int, int, int, str], list[float]]
    """When checkpoint saves began, by (attempt, rank, step, tier), in time order (a rank may save one step twice:
    Lightning writes ``step=N.ckpt`` and ``last.ckpt``; the memory tier copies a step storage also saves, and its
    background part can end before an async storage save of that step does)."""
    blocks: dict[int, list[_Block]]
    """Each attempt's step blocks, in time order."""
    redo_from: dict[int, float]
    """The first step a later attempt ran again: this attempt's executions of it and beyond were lost
    (infinity when no later attempt ran a step)."""
    previous: dict[int, int]
    """The attempt before each one (-1 for the first): start-up and restore are charged to it."""
    following: dict[int, int | None]
    """The attempt after each one (None for the last)."""

    def failures_of(self, attempt: int) -> list[FailureDetected]:
        return self.failures.get(attempt, [])


def _load(run: RunDir | str | os.PathLike[str] | list[LoadedEvent] | FoldedRun, step_records_kept: int
          ) -> FoldedRun:
    """The run's records, read in one pass with step records beyond the cap folded (`trainguard.accounting.stepfold`); a
    bare list is taken as it is."""
    if isinstance(run, FoldedRun):
        return run
    if isinstance(run, list):
        return FoldedRun(items=run, run_id="", root=None, skipped=SkippedRecords(keep=LISTED), excluded=[],
                         excluded_total=0)
    return fold_run(run, kept=step_records_kept)


def _reading_warnings(skipped: SkippedRecords, excluded: list[ExcludedRecord], excluded_total: int) -> list[str]:
    warnings = []
    if skipped.total:
        warnings.append(f"{skipped.total} unreadable record(s) skipped (first: {skipped.items[0]}); "
                        "see skipped_records")
    if excluded:
        warnings.append(f"{excluded_total} implausible record(s) excluded from the accounting "
                        f"(first: {excluded[0]}); see excluded_records")
    return warnings


def _clock_warnings(offsets: dict[str, float], reference: str) -> list[str]:
    return [f"clock of host {host!r} is {offset:+.3f} s off the reference host {reference!r}; corrected"
            for host, offset in offsets.items() if abs(offset) > 1.0]


def _wall_span(records: list[Event], blocks: list[_Block], clock: _ReferenceClock,
               run_started: RunStarted | None, run_ended: RunEnded | None) -> tuple[float, float]:
    """run_started (else the first record or step start) to run_ended (else the last record)."""
    start = clock.at(run_started) if run_started else min(min(clock.at(record) for record in records),
                                                          min((block.start for block in blocks), default=float("inf")))
    end = clock.at(run_ended) if run_ended else max(clock.at(record) for record in records)
    return start, end


def _redo_from(numbers: list[int], blocks: dict[int, list[_Block]]) -> dict[int, float]:
    """For each attempt, the lowest first step of any later attempt: one backward pass."""
    redo_from: dict[int, float] = {}
    lowest_later = float("inf")
    for attempt in reversed(numbers):
        redo_from[attempt] = lowest_later
        if blocks.get(attempt):
            lowest_later = min(lowest_later, min(block.first for block in blocks[attempt]))
    return redo_from


def _collect_attempts(records: list[Event], blocks: list[_Block], clock: _ReferenceClock,
                      run_start: float) -> _Attempts:
    started: dict[int, float] = {}
    ended: dict[int, float] = {}
    end_reason: dict[int, str] = {}
    failures: dict[int, list[FailureDetected]] = defaultdict(list)
    planned: dict[int, PlannedInterruption] = {}
    diagnoses: dict[int, Diagnosis] = {}
    save_starts: dict[tuple[int, int, int, str], list[float]] = defaultdict(list)
    for record in records:
        if isinstance(record, AttemptStarted):
            started[record.attempt] = clock.at(record)
        elif isinstance(record, AttemptEnded):
            ended[record.attempt], end_reason[record.attempt] = clock.at(record), record.reason
        elif isinstance(record, FailureDetected):
            failures[record.attempt].append(record)
        elif isinstance(record, PlannedInterruption):
            planned[record.attempt] = record
        elif isinstance(record, Diagnosis):
            best = diagnoses.get(record.attempt)
            if best is None or record.confidence > best.confidence:
                diagnoses[record.attempt] = record
        elif isinstance(record, CheckpointSaveStarted):
            save_starts[(record.attempt, record.rank, record.step, record.tier)].append(clock.at(record))
    by_attempt: dict[int, list[_Block]] = defaultdict(list)
    for block in blocks:
        by_attempt[block.attempt].append(block)
    numbers = sorted(set(started) | set(by_attempt) | set(failures) | set(ended)) or [0]
    for attempt in numbers:  # runs without a supervisor have no attempt records
        first_step_start = min((block.start for block in by_attempt.get(attempt, [])), default=run_start)
        started.setdefault(attempt, first_step_start if attempt else run_start)
    return _Attempts(
        numbers=numbers, started=started, ended=ended, end_reason=end_reason, failures=dict(failures),
        planned=planned, diagnoses=diagnoses, save_starts={k: sorted(v) for k, v in save_starts.items()},
        blocks=dict(by_attempt),
        redo_from=_redo_from(numbers, by_attempt),
        previous={attempt: (numbers[index - 1] if index else -1) for index, attempt in enumerate(numbers)},
        following={attempt: (numbers[index + 1] if index + 1 < len(numbers) else None)
                   for index, attempt in enumerate(numbers)},
    )


def _step_intervals(blocks: list[_Block], redo_from: dict[int, float]) -> tuple[list[Interval], int]:
    """Each block's kept steps are productive and its redone ones lost; also the last step kept."""
    intervals: list[Interval] = []
    completed = 0
    for block in blocks:
        steps = block.last - block.first + 1
        kept = max(0, min(steps, int(min(redo_from[block.attempt], block.last + 1) - block.first)))
        cut = block.start + (block.end - block.start) * kept / steps
        if kept:
            intervals.append((block.start, cut, PRODUCTIVE, block.attempt))
            completed = max(completed, block.first + kept - 1)
        if kept < steps:
            intervals.append((cut, block.end, "lost_progress", block.attempt))
    return intervals, completed


def _failure_onset(attempts: _Attempts, attempt: int, clock: _ReferenceClock) -> float | None:
    """When the fault that ended an attempt happened (detection time less latency), if one did."""
    failures = attempts.failures_of(attempt)
    if failures:
        return min(clock.at(failure) - failure.detection_latency_seconds for failure in failures)
    if attempt in attempts.planned:
        return clock.at(attempts.planned[attempt])
    return attempts.ended.get(attempt) if attempts.end_reason.get(attempt) == "failure" else None


def _startup_interval(attempts: _Attempts, attempt: int, onset: float | None, run_start: float,
                      run_end: float) -> Interval:
    """From the attempt's start to its first step (or its end): charged to the attempt before."""
    blocks = attempts.blocks.get(attempt, [])
    if blocks:
        startup_end = min(block.start for block in blocks)
    else:
        startup_end = onset if onset is not None else attempts.ended.get(attempt, run_end)
    begin = run_start if attempt == attempts.numbers[0] else attempts.started[attempt]
    return begin, startup_end, "startup", attempts.previous[attempt]


def _restart_interval(attempts: _Attempts, attempt: int, onset: float | None,
                      clock: _ReferenceClock) -> Interval | None:
    """From detection (or the attempt's end) to the next attempt's start."""
    following = attempts.following[attempt]
    if following is None:
        return None
    detected = [clock.at(failure) for failure in attempts.failures_of(attempt)]
    fallback = onset if onset is not None else attempts.started[following]
    gap_from = min(detected) if detected else attempts.ended.get(attempt, fallback)
    return gap_from, attempts.started[following], "restart", attempt


def _attempt_intervals(attempts: _Attempts, attempt: int, clock: _ReferenceClock, run_start: float,
                       run_end: float) -> list[Interval]:
    """Lost progress up to the fault, detection, start-up and the restart gap of one attempt."""
    intervals: list[Interval] = []
    redo = attempts.redo_from[attempt]
    onset = _failure_onset(attempts, attempt, clock)
    lost_from = [block.start + (block.end - block.start) * max(0, redo - block.first) / (block.last - block.first + 1)
                 for block in attempts.blocks.get(attempt, []) if block.last >= redo]
    if lost_from and onset is not None:
        intervals.append((min(lost_from), onset, "lost_progress", attempt))
    for failure in attempts.failures_of(attempt):
        detected_at = clock.at(failure)
        intervals.append((detected_at - failure.detection_latency_seconds, detected_at, "detection", attempt))
    intervals.append(_startup_interval(attempts, attempt, onset, run_start, run_end))
    restart = _restart_interval(attempts, attempt, onset, clock)
    if restart is not None:
        intervals.append(restart)
    return intervals


def _checkpoint_intervals(records: list[Event], clock: _ReferenceClock, attempts: _Attempts) -> list[Interval]:
    """Blocking part of each save; each restore, charged to the interruption before its attempt."""
    intervals: list[Interval] = []
    for record in records:
        if isinstance(record, CheckpointSaveFinished):
            key = (record.attempt, record.rank, record.step, record.tier)
            start = _save_start(attempts.save_starts.get(key, []), clock.at(record), record.total_seconds)
            intervals.append((start, start + record.blocking_seconds, "checkpoint_save", record.attempt))
        elif isinstance(record, CheckpointLoaded):
            intervals.append((clock.at(record) - record.seconds, clock.at(record), "checkpoint_restore",
                              attempts.previous.get(record.attempt, -1)))
    return intervals


def _save_start(starts: list[float], finished: float, total_seconds: float) -> float:
    """When the save that finished at ``finished`` began: the last matching start before it, else its total."""
    before = bisect.bisect_right(starts, finished)
    return starts[before - 1] if before else finished - total_seconds


@dataclass(frozen=True)
class _Tally:
    """The wall time cut into labels."""

    by_label: dict[str, float]
    """Seconds per label (productive and each badput bucket)."""
    by_owner: dict[int, float]
    """Seconds each attempt's interruption cost in all (its whole cost)."""
    lost_progress: dict[int, float]
    """Of that, the seconds of training redone after each attempt's interruption."""


def _tally(spent: dict[tuple[str, int], float]) -> _Tally:
    by_label: dict[str, float] = defaultdict(float)
    by_owner: dict[int, float] = defaultdict(float)
    lost: dict[int, float] = defaultdict(float)
    for (label, owner), seconds in spent.items():
        by_label[label] += seconds
        if label not in (PRODUCTIVE, "other", "checkpoint_save", "straggler"):
            by_owner[owner] += seconds
        if label == "lost_progress":
            lost[owner] += seconds
    return _Tally(by_label, by_owner, lost)


def _interruption(attempts: _Attempts, attempt: int, clock: _ReferenceClock, run_start: float,
                  time_lost: float) -> Interruption | None:
    """The interruption that ended an attempt: its first failure seen, else its planned stop."""
    failures = attempts.failures_of(attempt)
    if failures:
        first = min(failures, key=clock.at)
        diagnosis = attempts.diagnoses.get(attempt)
        return Interruption(
            time_seconds=clock.at(first) - run_start, attempt=attempt, kind=first.kind, planned=False,
            step=first.step, ranks=first.ranks, hosts=first.hosts,
            detection_latency_seconds=first.detection_latency_seconds,
            category=diagnosis.category if diagnosis else "Unknown", group=diagnosis.group if diagnosis else "Unknown",
            culprit_ranks=diagnosis.culprit_ranks if diagnosis else (),
            culprit_hosts=diagnosis.culprit_hosts if diagnosis else (),
            verdict=diagnosis.verdict if diagnosis else "", time_lost_seconds=time_lost,
        )
    if attempt in attempts.planned:
        return Interruption(
            time_seconds=clock.at(attempts.planned[attempt]) - run_start, attempt=attempt, kind="planned",
            planned=True, step=None, ranks=(), hosts=(), detection_latency_seconds=0.0, category="Planned",
            group="Planned", culprit_ranks=(), culprit_hosts=(), verdict="", time_lost_seconds=time_lost,
        )
    return None


def compute_goodput(run: RunDir | str | os.PathLike[str] | list[LoadedEvent] | FoldedRun, *,
                    step_records_kept: int = STEP_RECORDS_KEPT) -> GoodputReport:
    """Account for the wall time of a run from its events.

    Unusable records (torn, not JSON, wrong types) are skipped by the reader and implausible ones are
    excluded (`judge_records`); both are listed in the report and counted in its warnings. A run folder is
    read in one pass; beyond ``step_records_kept`` step records, the rest are folded into spans
    (`trainguard.accounting.stepfold`, docs/goodput.md "Long runs") so memory stays bounded.
    """
    folded = _load(run, step_records_kept)
    skipped, run_id, root = folded.skipped, folded.run_id, folded.root
    loaded, judged = judge_records(folded.items)
    excluded = folded.excluded + judged
    excluded_total = folded.excluded_total + len(judged)
    if not loaded:
        example = f", first: {excluded[0]}" if excluded else ""
        raise InputError(f"{run_id or 'run'}: no plausible events ({excluded_total} excluded{example})")
    records = [item.record for item in loaded]
    reference = reference_host(records)
    offsets = estimate_offsets(records, reference)
    clock = _ReferenceClock(offsets)
    warnings = (_reading_warnings(skipped, excluded, excluded_total) + _clock_warnings(offsets, reference)
                + folded.warnings())
    run_started = next((record for record in records if isinstance(record, RunStarted)), None)
    run_ended = final_run_end(records)  # the last one: a requeued job has one per allocation
    if run_ended is None:
        warnings.append("the run has no run_ended record: accounted up to its last event")
    raw_blocks = _blocks(records, offsets)
    run_start, run_end = _wall_span(records, raw_blocks, clock, run_started, run_ended)
    steps = _attempt_steps(records, raw_blocks)
    points = resume.infer(steps, resume.loaded_evidence(records), _evidence_finder(root, run_started, records, clock))
    stragglers = _stragglers(records, root)
    kept = resume.offsets(steps, points, Scenario.KEPT)
    account = _account(records, _shifted(raw_blocks, kept), kept, stragglers, clock, run_start, run_end)
    attempts, tally, completed = account
    by_label, by_owner, lost_progress = tally.by_label, tally.by_owner, tally.lost_progress
    redone_steps = resume.lost_steps(steps, points, kept)
    stepped = {s.attempt for s in steps}
    interruptions = [replace(found, lost_steps=redone_steps.get(attempt, None if attempt in stepped else 0),
                             lost_progress_seconds=lost_progress.get(attempt, 0.0))
                     for attempt in attempts.numbers
                     if (found := _interruption(attempts, attempt, clock, run_start, by_owner.get(attempt, 0.0)))
                     is not None]
    unknown_note = None
    if resume.unknown(points):
        redone = resume.offsets(steps, points, Scenario.REDONE)
        _, redone_tally, redone_completed = _account(records, _shifted(raw_blocks, redone), redone, stragglers,
                                                         clock, run_start, run_end)
        unknown_note = _unknown_note(points, redone_tally.by_label, redone_completed, run_end - run_start)
        warnings.append(_unknown_warning(points, by_label, unknown_note))
    blocks = raw_blocks

    return GoodputReport(
        run_id=run_id or (run_started.run_id if run_started else ""),
        status=run_ended.status if run_ended else "incomplete",
        synthetic=bool(run_started and run_started.synthetic),
        wall_seconds=run_end - run_start,
        productive_seconds=by_label[PRODUCTIVE],
        badput_seconds={bucket: by_label[bucket] for bucket in BUCKETS},
        attempts=len(attempts.numbers),
        completed_steps=completed,
        target_steps=run_started.target_steps if run_started else None,
        interruptions=interruptions,
        steps_per_second=throughput([(b.start, b.end, b.last - b.first + 1) for b in blocks], run_start, run_end),
        root_causes=root_causes(interruptions),
        clock_offsets_seconds={host: offset for host, offset in offsets.items() if offset},
        warnings=warnings,
        skipped_records=list(skipped.items),
        skipped_records_total=skipped.total,
        excluded_records=excluded[:LISTED],
        excluded_records_total=excluded_total,
        resume_points=[points[a] for a in sorted(points) if a != min(points)],
        lost_progress_unknown=unknown_note,
    )


def _account(records: list[Event], blocks: list[_Block], shift: dict[int, int], stragglers: list[Any],
             clock: _ReferenceClock, run_start: float, run_end: float
             ) -> tuple[_Attempts, _Tally, int]:
    """Cut the wall time with the steps numbered as ``blocks`` say: the attempts, the seconds per label and per
    interrupted attempt, and the highest kept step."""
    attempts = _collect_attempts(records, blocks, clock, run_start)
    intervals, completed = _step_intervals(blocks, attempts.redo_from)
    for attempt in attempts.numbers:
        intervals.extend(_attempt_intervals(attempts, attempt, clock, run_start, run_end))
    intervals.extend(_straggler_intervals(stragglers, attempts.redo_from, shift))
    intervals.extend(_checkpoint_intervals(records, clock, attempts))
    return attempts, _tally(_sweep(intervals, run_start, run_end)), completed


def _evidence_finder(root: Path | None, run_started: RunStarted | None, records: list[Event],
                     clock: _ReferenceClock) -> Any:
    """Looks for the resume point of an attempt in its log files, then in the script's checkpoint files."""
    if root is None:
        return None
    config = run_started.config if run_started is not None else {}
    logs_root = config.get("logs_dir_override") if isinstance(config, dict) else None
    layout = RunLayout(root, Path(logs_root) if isinstance(logs_root, str) and logs_root else None)
    command = config.get("command") if isinstance(config, dict) else None
    started = {r.attempt: clock.at(r) for r in records if isinstance(r, AttemptStarted)}
    files: list[resume.CheckpointFile] | None = None

    def more(steps: AttemptSteps, trained: int) -> resume.Evidence | None:
        nonlocal files
        logs = layout.logs_dir(steps.attempt)
        paths = sorted(logs.glob("rank-*.log"), key=lambda p: (_rank_of(p.name), p.name))
        found = resume.resume_in_logs(paths)
        if found is not None or steps.attempt not in started or not isinstance(command, list):
            return found
        if files is None:
            files = resume.checkpoint_files(resume.command_folders([str(c) for c in command], Path.cwd()))
        return resume.resume_in_files(files, started[steps.attempt], trained)

    def guarded(steps: AttemptSteps, trained: int) -> resume.Evidence | None:
        try:
            return more(steps, trained)
        except (OSError, ValueError) as exc:  # evidence is optional: a path the system refuses is no evidence
            log.debug("resume evidence of attempt %d: %s", steps.attempt, exc)
            return None

    return guarded


def _rank_of(name: str) -> int:
    digits = name.removeprefix("rank-").split(".", 1)[0]
    return int(digits) if digits.isdigit() else 1 << 30


def _unknown_note(points: dict[int, ResumePoint], redone: dict[str, float], redone_completed: int,
                  wall: float) -> dict[str, Any]:
    return {
        "attempts": resume.unknown(points),
        "lost_progress_seconds_max": redone["lost_progress"],
        "ettr_min": redone[PRODUCTIVE] / wall if wall > 0 else 0.0,
        "completed_steps_min": redone_completed,
        "assumed": "kept: the attempts before them are counted as not redone",
    }


def _unknown_warning(points: dict[int, ResumePoint], kept: dict[str, float], note: dict[str, Any]) -> str:
    parts = "; ".join(f"attempt {a}: {points[a].detail}" for a in note["attempts"])
    return (f"lost progress is unknown ({parts}): the steps of the attempts before are counted as kept "
            f"(lost progress {kept['lost_progress']:.1f} s); had the job started over there, lost progress would "
            f"be {note['lost_progress_seconds_max']:.1f} s, ETTR {note['ettr_min']:.3f} and completed steps "
            f"{note['completed_steps_min']}")


def _stragglers(records: list[Event], root: Any) -> list[Any]:
    """The named stragglers of the run (`trainguard.stragglers.analyze`); none when the analysis fails."""
    from trainguard.stragglers import analyze, read_arrivals

    try:
        return list(analyze(records, read_arrivals(root) if root is not None else None).stragglers)
    except Exception as exc:  # the straggler bucket must never cost the rest of the report
        log.warning("straggler accounting skipped: %s", exc)
        return []


def _straggler_intervals(found: list[Any], redo_from: dict[int, float],
                         shift: dict[int, int]) -> list[tuple[float, float, str, int]]:
    """``[end - saved, end]`` of every kept step a named straggler slowed: the time it would not have taken."""
    return [(end - saved, end, "straggler", attempt) for s in found for attempt, step, end, saved in s.saved_by_step
            if saved > 0 and step + shift.get(attempt, 0) < redo_from.get(attempt, float("inf"))]
