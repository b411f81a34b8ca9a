"""Per-link history from the fleet database: how many runs saw each HCA port or NVLink fail or flap.

A link that shows transient errors (retries, non-fatal SXids) in several runs is flagged ``flapping``
before it fails a job. Pure: it reads `trainguard.health.fleetdb.HostRecord`-like rows (host, run_id, time, kind,
detail) of the link kinds. Shown by ``trainguard hosts --links``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainguard.health.lemon import HostRecordLike

FLAPPING_RUNS = 2
"""Runs with transient errors on one link that make it ``flapping``."""


@dataclass
class LinkHistory:
    """What the indexed runs' diagnoses said about one link of one host."""

    host: str
    link: str
    """``mlx5_3:1 -> node-04`` (local HCA port or GPU link, then the remote end; ``-`` when not known)."""
    failed_runs: set[str] = field(default_factory=set)
    """Runs in which the link had failing lines."""
    flapped_runs: set[str] = field(default_factory=set)
    """Runs in which it had only transient lines."""
    last_seen: float = 0.0

    @property
    def flapping(self) -> bool:
        return len(self.flapped_runs) >= FLAPPING_RUNS

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "link": self.link, "failed_runs": len(self.failed_runs),
                "flapped_runs": len(self.flapped_runs), "flapping": self.flapping, "last_seen": self.last_seen}


def summarize(records: Iterable[HostRecordLike]) -> list[LinkHistory]:
    """One entry per (host, link), the most troubled first (failed runs, then flapped runs, then name)."""
    by_link: dict[tuple[str, str], LinkHistory] = {}
    for r in records:
        if r.kind not in ("link_failed", "link_flapped"):
            continue
        h = by_link.setdefault((r.host, r.detail), LinkHistory(r.host, r.detail))
        (h.failed_runs if r.kind == "link_failed" else h.flapped_runs).add(r.run_id)
        h.last_seen = max(h.last_seen, r.time)
    return sorted(by_link.values(), key=lambda h: (-len(h.failed_runs), -len(h.flapped_runs), h.host, h.link))
