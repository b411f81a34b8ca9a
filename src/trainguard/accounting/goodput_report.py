"""What a goodput report holds: the report, its interruptions, and the figures drawn from them (throughput bins,
the root-cause table); `trainguard.accounting.goodput` cuts the wall time that fills them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from trainguard.accounting.plausibility import ExcludedRecord
from trainguard.accounting.resume import ResumePoint
from trainguard.core.eventlog import SkippedRecord


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
    """The whole cost: lost progress + detection + restart gap of this attempt, plus start-up and restore of the
    next."""
    lost_steps: int | None = None
    """Steps trained before the interruption that the next attempt ran again (the highest step reached minus the
    step it resumed from); None when its resume point is unknown or no attempt with steps followed."""
    lost_progress_seconds: float = 0.0
    """The part of the whole cost that was training redone: the time those lost steps had taken."""


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
    """Records the reader could not use (torn, not JSON, wrong field types), the first
    `trainguard.accounting.stepfold.LISTED` of them."""
    skipped_records_total: int = 0
    """How many records were skipped in all."""
    excluded_records: list[ExcludedRecord] = field(default_factory=list)
    """Readable but implausible records left out of the accounting, the first
    `trainguard.accounting.stepfold.LISTED` of them."""
    excluded_records_total: int = 0
    """How many records were excluded in all."""
    resume_points: list[ResumePoint] = field(default_factory=list)
    """Where each attempt with steps continued from, and how that is known (`trainguard.accounting.resume`)."""
    lost_progress_unknown: dict[str, Any] | None = None
    """When some attempt's resume point is unknown: those attempts, and the lost progress, ETTR and completed
    steps had they started over (the report's own figures assume they did not redo anything)."""

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
            "resume_points": [p.to_json() for p in self.resume_points],
            "lost_progress_unknown": self.lost_progress_unknown,
        }


def throughput(blocks: list[tuple[float, float, int]], lo: float, hi: float,
               bins: int = 60) -> list[tuple[float, float]]:
    """Executed steps per second in ``bins`` equal bins over the run, from ``(start, end, steps)`` blocks (steps of
    a block spread evenly)."""
    if hi <= lo:
        return []
    width = (hi - lo) / bins
    counts = [0.0] * bins

    def bin_of(x: float) -> int:
        # Clamp before int(): with a tiny width the quotient can overflow to infinity.
        return int(min(max((x - lo) / width, -1.0), float(bins)))

    for start, end, n in blocks:
        i0, i1 = bin_of(start), bin_of(end)
        if end <= start:
            counts[min(max(i0, 0), bins - 1)] += n
            continue
        # Spread the block's steps over its interval, bin by bin.
        for i in range(max(i0, 0), min(i1, bins - 1) + 1):
            s, e = max(start, lo + i * width), min(end, lo + (i + 1) * width)
            counts[i] += n * max(e - s, 0.0) / (end - start)
    return [(i * width, c / width) for i, c in enumerate(counts)]


def root_causes(interruptions: list[Interruption]) -> list[dict[str, Any]]:
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
