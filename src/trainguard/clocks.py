"""Clock-skew correction across hosts, from the events alone.

Ranks of a synchronous job finish a step within a collective of each other, so the same
(attempt, step) ends at (almost) the same instant on every host. The offset of a host's clock from
the reference host is the median, over the steps both saw, of the difference in end times.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence

from trainguard.events import AttemptStarted, Event, RunStarted, StepCompleted


def reference_host(records: Sequence[Event]) -> str:
    """The host whose clock is the run's clock: the run starter's, else the most common writer."""
    for cls in (RunStarted, AttemptStarted):
        for e in records:
            if isinstance(e, cls):
                return e.host
    counts = Counter(e.host for e in records)
    return counts.most_common(1)[0][0] if counts else ""


def estimate_offsets(records: Sequence[Event], reference: str) -> dict[str, float]:
    """Seconds to subtract from each host's timestamps to put them on the reference clock.

    Hosts that share no step with the reference get offset 0 (nothing to align them with).
    """
    ends: dict[str, dict[tuple[int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for e in records:
        if isinstance(e, StepCompleted):
            ends[e.host][(e.attempt, e.step)].append(e.time)
    offsets: dict[str, float] = {host: 0.0 for host in {e.host for e in records}}
    ref = ends.get(reference, {})
    for host, steps in ends.items():
        if host == reference:
            continue
        diffs = [
            statistics.median(times) - statistics.median(ref[key]) for key, times in steps.items() if key in ref
        ]
        if diffs:
            offsets[host] = statistics.median(diffs)
    return offsets
