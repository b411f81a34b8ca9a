"""How long a hang went before the agent declared it, and from what that is counted.

An injected fault (``--inject hang@...``) writes a ``FaultInjected`` record with its time just before it
strikes: the latency is then counted from the fault itself. Otherwise nobody knows when the fault came; the
latency is counted from the job's last progress the watchdog saw (its ``Verdict.onset_mono``), which is only
an estimate: see docs/run.md ("Hang detection latency").
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from trainguard.core.eventlog import parse_record
from trainguard.core.events import FaultInjected
from trainguard.core.protocol import RunLayout

log = logging.getLogger(__name__)

HANG_FAULTS = ("hang", "hang-in-collective", "desync")
"""Chaos faults that make a job hang (`trainguard.chaos.faults`)."""
TAIL_BYTES = 256 * 1024
"""How much of each rank's event file is read: the fault's record is among its last ones."""


@dataclass(frozen=True)
class HangLatency:
    """A hang's detection latency and its origin."""

    seconds: float
    origin: str
    """``fault`` (an injected fault's own record) or ``last-progress`` (the job's last progress seen)."""


def injected_fault_time(layout: RunLayout, attempt: int, ranks: list[int]) -> float | None:
    """Wall time of the earliest hang fault injected in ``attempt`` on one of ``ranks``, if any."""
    times = []
    for rank in ranks:
        path = layout.rank_events(rank)
        try:
            with path.open("rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - TAIL_BYTES))
                lines = fh.read().split(b"\n")
        except OSError:
            continue
        if size > TAIL_BYTES:
            lines = lines[1:]  # the first one is cut
        for n, raw in enumerate(lines):
            if b'"fault_injected"' not in raw:
                continue
            try:
                record = parse_record(raw, str(path), n)
            except Exception:  # a torn or foreign line: not evidence of a fault
                continue
            if isinstance(record, FaultInjected) and record.attempt == attempt and record.kind in HANG_FAULTS:
                times.append(record.time)
    return min(times) if times else None


def hang_latency(layout: RunLayout, attempt: int, ranks: list[int], detected_wall: float,
                 since_last_progress: float) -> HangLatency:
    """From the injected fault when its record is found (and not later than the detection: clocks of other
    hosts may disagree), else from the last progress."""
    fault = injected_fault_time(layout, attempt, ranks)
    if fault is not None and fault <= detected_wall:
        return HangLatency(detected_wall - fault, "fault")
    return HangLatency(max(0.0, since_last_progress), "last-progress")
