"""Bounded memory for long runs: a run's records stream in one at a time, and once its step records pass a
cap they are folded into per-host spans of a window of steps instead of being kept one by one.

Step records are nearly all of a long run's events (docs/goodput.md, "Long runs"). Below the cap nothing is
folded and the accounting sees exactly the records it always did. Above it, runs of consecutive steps spread
evenly over the run stay whole as a sample (clock offsets and stragglers are judged on them), and every other
step record joins the `FoldedSteps` span of its (attempt, host, window of steps); the window doubles whenever
the spans pass half the cap and the sample thins whenever it passes a half, so memory stays bounded whatever
the number of records.
"""

from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from trainguard.accounting.plausibility import ExcludedRecord, intrinsic_problem
from trainguard.core.eventlog import SkippedRecords, iter_run
from trainguard.core.events import StepCompleted, StepSpan
from trainguard.core.rundir import LoadedEvent, RunDir

log = logging.getLogger(__name__)

STEP_RECORDS_KEPT = 100_000
"""Step records kept one by one before folding starts (about 50 MB of records; docs/goodput.md)."""
SAMPLE_RUN_STEPS = 64
"""Once folding starts, steps stay whole in runs of this many consecutive steps (enough for the straggler
analysis's 5 windows of 8 steps), every ``stride``-th run, the stride doubling as the run grows."""
LISTED = 100
"""Excluded records listed one by one; beyond that only counted."""
_COLLECT_EVERY = 100_000
"""Records read between two collections of the youngest generation (`fold_run`)."""
FOLDED_WRITER = "(folded steps)"
"""The writer name `FoldedSteps` records carry (they come from no one file)."""


@dataclass(frozen=True, kw_only=True)
class FoldedSteps(StepSpan):
    """The step records of one attempt and host within one window of step numbers, folded into one span: from
    the earliest start to the latest end of any of them (``time`` is that end)."""

    TYPE: ClassVar[str] = "folded_steps"
    numberings: tuple[str, ...] = ()
    """The step numberings the folded records had (``""`` for `StepSpan` records)."""
    records: int = 0
    """How many step records were folded into it."""


@dataclass
class _Fold:
    """A span being built: step range, time range and what went into it."""

    first: int
    last: int
    start: float
    end: float
    rank: int
    numberings: set[str] = field(default_factory=set)
    records: int = 0

    def take(self, first: int, last: int, start: float, end: float, numbering: str, records: int) -> None:
        self.first, self.last = min(self.first, first), max(self.last, last)
        self.start, self.end = min(self.start, start), max(self.end, end)
        self.numberings.add(numbering)
        self.records += records


def _steps_of(record: StepCompleted | StepSpan) -> tuple[int, int]:
    return (record.step, record.step) if isinstance(record, StepCompleted) else (record.first_step, record.last_step)


@dataclass
class FoldedRun:
    """A run's records read in one pass with bounded memory: what `compute_goodput` and the report sections read."""

    items: list[LoadedEvent]
    """The records kept whole (all of them when nothing was folded), in file order, then the folded spans."""
    run_id: str
    """The run folder's name ("" when the records did not come from a folder)."""
    root: Path | None
    """The run folder."""
    skipped: SkippedRecords
    """Records the reader could not use."""
    excluded: list[ExcludedRecord]
    """Records excluded as they streamed in (`intrinsic_problem`), the first `LISTED` of them."""
    excluded_total: int
    """How many were excluded in all."""
    folded_records: int = 0
    """Step records folded into spans (0: nothing was folded)."""
    spans: int = 0
    """`FoldedSteps` spans they became."""
    window: int = 1
    """Steps per window at the end."""
    sample_stride: int = 0
    """Once folding started: every this-many-th run of `SAMPLE_RUN_STEPS` steps stayed whole ..."""
    sample_run: int = SAMPLE_RUN_STEPS
    """... its first this many steps."""

    def warnings(self) -> list[str]:
        """One line saying what folding changed, when it happened."""
        if not self.folded_records:
            return []
        return [f"{self.folded_records} step records folded into {self.spans} spans of up to {self.window} steps "
                f"per host to bound memory (docs/goodput.md): clock offsets and stragglers are judged on the steps "
                f"kept whole, {self.sample_run} of every {self.sample_stride * SAMPLE_RUN_STEPS}"]


class StepFolder:
    """Takes a run's records one at a time and keeps at most about ``kept`` step records whole."""

    def __init__(self, kept: int = STEP_RECORDS_KEPT) -> None:
        self.kept = max(4, kept)
        self.items: list[LoadedEvent] = []
        self.excluded: list[ExcludedRecord] = []
        self.excluded_total = 0
        self._whole_steps = 0
        self._stride = 0  # 0: nothing folded yet
        self._run = SAMPLE_RUN_STEPS
        self._folds: dict[tuple[int, str, int], _Fold] = {}
        self._window = 1
        self._widening = False
        self.folded_records = 0

    def add(self, item: LoadedEvent) -> None:
        record = item.record
        problem = intrinsic_problem(record)
        if problem is not None:  # judged here: a folded record could no longer be named
            self.excluded_total += 1
            if len(self.excluded) < LISTED:
                self.excluded.append(ExcludedRecord(item.writer, item.line, record.TYPE, problem))
            return
        if not isinstance(record, (StepCompleted, StepSpan)):
            self.items.append(item)
            return
        if not self._whole(record):
            self._fold(record)
            return
        self.items.append(item)
        self._whole_steps += 1
        # Before folding starts the cap is ``kept``; after, the sample may grow back to half of it.
        if self._whole_steps > (self.kept if self._stride == 0 else self.kept // 2):
            self._shrink_sample()

    def _whole(self, record: StepCompleted | StepSpan) -> bool:
        """Whether a step record stays whole: its step is among the first ``run`` of every ``stride``-th
        `SAMPLE_RUN_STEPS` steps (always, before folding starts)."""
        if self._stride == 0:
            return True
        block, within = divmod(_steps_of(record)[0] - 1, SAMPLE_RUN_STEPS)
        return block % self._stride == 0 and within < self._run

    def _shrink_sample(self) -> None:
        """Thin the whole steps to at most a quarter of the cap, evenly over the run: double the stride between
        the runs of steps kept whole, or, when one run is all that is left, shorten it; fold the rest."""
        steps = [_steps_of(item.record)[0] - 1 for item in self.items
                 if isinstance(item.record, (StepCompleted, StepSpan))]
        self._stride = max(self._stride, 1)

        def whole(stride: int, run: int) -> int:
            return sum(1 for step in steps if (step // SAMPLE_RUN_STEPS) % stride == 0
                       and step % SAMPLE_RUN_STEPS < run)

        count = whole(self._stride, self._run)
        while count > self.kept // 4 and self._run > 0:
            wider = whole(self._stride * 2, self._run)
            if wider < count:
                self._stride, count = self._stride * 2, wider
            else:  # only the first run of each attempt is left: keep fewer of its steps
                self._run //= 2
                count = whole(self._stride, self._run)
        self._evict()

    def _evict(self) -> None:
        """Fold the step records kept whole that the sample no longer holds."""
        kept: list[LoadedEvent] = []
        whole = 0
        for item in self.items:
            record = item.record
            if isinstance(record, (StepCompleted, StepSpan)):
                if not self._whole(record):
                    self._fold(record)
                    continue
                whole += 1
            kept.append(item)
        self.items, self._whole_steps = kept, whole

    def _fold(self, record: StepCompleted | StepSpan) -> None:
        first, last = _steps_of(record)
        numbering = record.numbering if isinstance(record, StepCompleted) else ""
        self._take((record.attempt, record.host, (first - 1) // self._window), first, last,
                   record.time - record.duration_seconds, record.time, record.rank, numbering, 1)
        self.folded_records += 1
        if len(self._folds) > self.kept // 2 and not self._widening:
            self._widen()

    def _take(self, key: tuple[int, str, int], first: int, last: int, start: float, end: float, rank: int,
              numbering: str, records: int) -> None:
        fold = self._folds.get(key)
        if fold is None:
            self._folds[key] = fold = _Fold(first, last, start, end, rank)
        fold.take(first, last, start, end, numbering, records)

    def _widen(self) -> None:
        """Double the window until the spans fit in a quarter of the cap (or no wider window helps). A window never
        outgrows the stride of the sample, so no span spans a run of whole steps (its steps would count twice):
        the sample thins first."""
        self._widening = True
        try:
            self._widen_windows()
        finally:
            self._widening = False

    def _widen_windows(self) -> None:
        while len(self._folds) > self.kept // 4:
            if self._window * 2 > SAMPLE_RUN_STEPS * self._stride:
                self._stride *= 2
                self._evict()
            before = len(self._folds)
            old, self._folds, self._window = self._folds, {}, self._window * 2
            for (attempt, host, index), f in old.items():
                wider = self._folds.get((attempt, host, index // 2))
                if wider is None:
                    self._folds[(attempt, host, index // 2)] = f
                else:
                    wider.first, wider.last = min(wider.first, f.first), max(wider.last, f.last)
                    wider.start, wider.end = min(wider.start, f.start), max(wider.end, f.end)
                    wider.numberings |= f.numberings
                    wider.records += f.records
            if len(self._folds) == before:  # one span per (attempt, host) already
                break

    def spans(self) -> list[LoadedEvent]:
        """The folded spans as records, in (attempt, host, window) order."""
        out = []
        for (attempt, host, _), f in sorted(self._folds.items()):
            span = FoldedSteps(time=f.end, host=host, attempt=attempt, rank=f.rank, first_step=f.first,
                               last_step=f.last, duration_seconds=f.end - f.start,
                               numberings=tuple(sorted(f.numberings)), records=f.records)
            out.append(LoadedEvent(FOLDED_WRITER, 0, span))
        return out

    def sample(self) -> tuple[int, int]:
        """(stride, run): the first ``run`` steps of every ``stride``-th run of `SAMPLE_RUN_STEPS` stay whole."""
        return self._stride, self._run

    @property
    def window(self) -> int:
        return self._window


def fold_run(run: RunDir | str | os.PathLike[str], *, kept: int = STEP_RECORDS_KEPT) -> FoldedRun:
    """Read a run folder in one pass, folding step records beyond ``kept`` (`StepFolder`). Raises `InputError`
    like `trainguard.core.eventlog.read_run`."""
    run_dir = run if isinstance(run, RunDir) else RunDir(run)
    skipped = SkippedRecords(keep=LISTED)
    folder = StepFolder(kept)
    # With the collector on, each full collection walks every record read so far, which made reading 20,000
    # files grow faster than the files (a third of the time). Records make no reference cycles; the youngest
    # generation is still collected every `_COLLECT_EVERY` records, so a cycle made while reading is freed.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for count, (writer, line, record) in enumerate(iter_run(run_dir.root, skipped=skipped), 1):
            folder.add(LoadedEvent(writer, line, record))
            if count % _COLLECT_EVERY == 0:
                gc.collect(0)
    finally:
        if collecting:
            gc.enable()
    spans = folder.spans()
    if folder.folded_records:
        log.info("%s: %d step records folded into %d spans", run_dir.root, folder.folded_records, len(spans))
    return FoldedRun(items=folder.items + spans, run_id=run_dir.run_id, root=run_dir.root, skipped=skipped,
                     excluded=folder.excluded, excluded_total=folder.excluded_total,
                     folded_records=folder.folded_records, spans=len(spans), window=folder.window,
                     sample_stride=folder.sample()[0], sample_run=folder.sample()[1])

