"""Per-host drain history from the fleet database: drained by trainguard, why and when, returned, drained again.

A host drained again soon after it was returned (``redrain_window_seconds``, 7 days by default) is flagged
``redrained``: the repair did not hold, the lemon signal Meta's research-cluster study uses. Pure: it reads
`trainguard.health.fleetdb.HostRecord`-like rows (host, time, kind, detail). Shown by ``trainguard hosts``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

REDRAIN_WINDOW_SECONDS = 7 * 86400.0
_KINDS = ("drained", "drain_refused", "drain_failed", "returned")


@dataclass
class HostDrains:
    """What the drain policy did to one host, over every indexed run."""

    host: str
    drained: int = 0
    refused: int = 0
    failed: int = 0
    returned: int = 0
    state: str = "never drained"
    """``drained`` (its last record is a drain), ``returned`` or ``never drained`` (only refusals or failures)."""
    last_drained: float | None = None
    last_reason: str = ""
    last_returned: float | None = None
    redrained: bool = False
    """Drained again within the window after a return."""
    redrained_after_seconds: float | None = None
    """Shortest time from a return to the next drain."""
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"drained": self.drained, "refused": self.refused, "failed": self.failed, "returned": self.returned,
                "state": self.state, "last_drained": self.last_drained, "last_reason": self.last_reason,
                "last_returned": self.last_returned, "redrained": self.redrained,
                "redrained_after_seconds": self.redrained_after_seconds, "history": self.history}


def summarize(records: Iterable[Any], *,
              redrain_window_seconds: float = REDRAIN_WINDOW_SECONDS) -> dict[str, HostDrains]:
    """Host -> its drain history, from rows with ``host``, ``time``, ``kind`` and ``detail``."""
    rows: dict[str, list[Any]] = defaultdict(list)
    for r in records:
        if r.kind in _KINDS:
            rows[r.host].append(r)
    out: dict[str, HostDrains] = {}
    for host, items in rows.items():
        h = HostDrains(host)
        returned_at: float | None = None
        for r in sorted(items, key=lambda r: r.time):
            h.history.append({"time": r.time, "kind": r.kind, "detail": r.detail})
            if r.kind == "drained":
                h.drained += 1
                h.state, h.last_drained, h.last_reason = "drained", r.time, r.detail
                if returned_at is not None:
                    gap = r.time - returned_at
                    if gap <= redrain_window_seconds:
                        h.redrained = True
                    if h.redrained_after_seconds is None or gap < h.redrained_after_seconds:
                        h.redrained_after_seconds = gap
                    returned_at = None
            elif r.kind == "returned":
                h.returned += 1
                h.state, h.last_returned, returned_at = "returned", r.time, r.time
            elif r.kind == "drain_refused":
                h.refused += 1
            else:
                h.failed += 1
        out[host] = h
    return out
