"""Clock-skew correction across hosts, from the events alone.

Ranks of a synchronous job finish a step within a collective of each other, so the same
(attempt, step) ends at (almost) the same instant on every host. The offset of a host's clock from
the reference host is the median, over the steps both saw, of the difference in end times.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence

from trainguard.core.events import AttemptStarted, Event, RunStarted, StepCompleted


def reference_host(records: Sequence[Event]) -> str:
    """The host whose clock is the run's clock: the run starter's, else the most common writer."""
    for cls in (RunStarted, AttemptStarted):
        for e in records:
            if isinstance(e, cls):
                return e.host
    counts = Counter(e.host for e in records)
    return counts.most_common(1)[0][0] if counts else ""


def _offset_between(steps: dict[tuple[int, int], list[float]],
                    other: dict[tuple[int, int], list[float]]) -> float | None:
    """Median difference of the end times of the steps both hosts saw; None when they share none."""
    diffs = [statistics.median(times) - statistics.median(other[key]) for key, times in steps.items() if key in other]
    return statistics.median(diffs) if diffs else None


def estimate_offsets(records: Sequence[Event], reference: str) -> dict[str, float]:
    """Seconds to subtract from each host's timestamps to put them on the reference clock.

    A host that shares no step with the reference (a spare that joined after the reference host died)
    is aligned through a host that shares steps with both; hosts connected to the reference by no such
    chain get offset 0 (nothing to align them with).
    """
    ends: dict[str, dict[tuple[int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for e in records:
        if isinstance(e, StepCompleted):
            ends[e.host][(e.attempt, e.step)].append(e.time)
    offsets: dict[str, float] = {host: 0.0 for host in {e.host for e in records}}
    aligned: dict[str, float] = {reference: 0.0} if reference in ends else {}
    pending = sorted(h for h in ends if h != reference)
    while pending and aligned:
        # Each pass aligns the hosts one more hop away; usually one pass does all (everyone shares steps
        # with the reference), so the pairwise comparison below runs only for the few hosts left over.
        found: dict[str, float] = {}
        for host in pending:
            for anchor, anchor_offset in aligned.items():
                diff = _offset_between(ends[host], ends[anchor])
                if diff is not None:
                    found[host] = anchor_offset + diff
                    break
        if not found:
            break
        aligned.update(found)
        pending = [h for h in pending if h not in found]
    for host, offset in aligned.items():
        offsets[host] = offset
    return offsets
