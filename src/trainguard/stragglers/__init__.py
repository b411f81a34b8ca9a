"""Stragglers: find the rank or host that holds a synchronous job back, say what it costs, act on it.

`analyze` (pure) works on a run's events and, for scripts without phases, flight-recorder arrival times
(`read_arrivals`); `trainguard.stragglers.watch` is the node agent's live side. docs/stragglers.md.
"""

from trainguard.stragglers.analysis import (
    FLIGHT_RECORDER,
    PHASES,
    HostSummary,
    Straggler,
    StragglerConfig,
    StragglerReport,
    analyze,
)
from trainguard.stragglers.flight import read_arrivals

__all__ = ["FLIGHT_RECORDER", "PHASES", "HostSummary", "Straggler", "StragglerConfig", "StragglerReport", "analyze",
           "read_arrivals"]
