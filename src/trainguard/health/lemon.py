"""Lemon nodes: hosts whose history says they keep breaking jobs, scored from the fleet database.

Each host's score sums weighted records of its history (named as culprit, named by a failure, excluded,
failed health checks, hardware XIDs, and participation in failed attempts beyond what is usual in the
fleet), each decayed with a half-life so that a repaired host recovers. A host is flagged when its score
reaches the threshold AND it was involved in at least two separate incidents. See docs/health.md.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

INCIDENT_WINDOW_SECONDS = 300.0
"""Records of one host in the same run within this window count as one incident."""


class HostRecordLike(Protocol):
    """What `score_hosts` reads (`trainguard.health.fleetdb.HostRecord` has these fields)."""

    @property
    def host(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def time(self) -> float: ...
    @property
    def kind(self) -> str: ...
    @property
    def detail(self) -> str: ...


@dataclass(frozen=True)
class LemonPolicy:
    """Weights and thresholds of the lemon score."""

    weights: dict[str, float] = field(default_factory=lambda: {
        "culprit": 3.0, "failure": 2.0, "excluded": 2.0, "check_failed": 1.0,
        "xid_hardware": 2.0, "xid_application": 0.5, "failed_attempt_member": 0.5,
    })
    """Points per record; ``failed_attempt_member`` is per failed attempt above the fleet median.
    Kinds without a weight (``check_failed_low``: failed low-severity checks) are listed, not scored."""
    half_life_days: float = 30.0
    """A record's points halve every this many days (0 = no decay)."""
    threshold: float = 6.0
    """Score at which a host is flagged (two culprit verdicts; or a culprit, a failure and a failed check)."""
    min_incidents: int = 2
    """Separate incidents (runs, or more than 5 minutes apart) needed to flag: one bad day is not a lemon."""


@dataclass(frozen=True)
class HostScore:
    """One host's standing."""

    host: str
    score: float
    flagged: bool
    reasons: tuple[str, ...]
    counts: dict[str, int]
    """Records per kind (``xid`` split into ``xid_hardware`` and ``xid_application``; ``check_failed``
    into ``check_failed`` (high severity) and ``check_failed_low``)."""
    incidents: int
    runs: int
    last_seen: float

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "score": round(self.score, 3), "flagged": self.flagged,
                "reasons": list(self.reasons), "counts": dict(self.counts), "incidents": self.incidents,
                "runs": self.runs, "last_seen": self.last_seen}


def _xid_kind(detail: str) -> str:
    from trainguard.classify import is_hardware_xid

    try:
        code = int(detail)
    except ValueError:
        return "xid_hardware"
    return "xid_hardware" if is_hardware_xid(code) else "xid_application"


def score_hosts(records: Iterable[HostRecordLike], *, policy: LemonPolicy | None = None,
                now: float | None = None) -> list[HostScore]:
    """Score every host in ``records``; highest score first (ties by name). Pure: no database needed."""
    policy = policy or LemonPolicy()
    now = time.time() if now is None else now
    by_host: dict[str, list[tuple[str, HostRecordLike]]] = defaultdict(list)
    for r in records:
        kind = r.kind
        if kind == "xid":
            kind = _xid_kind(r.detail)
        elif kind == "check_failed" and r.detail.endswith("(low)"):
            kind = "check_failed_low"  # drain-later findings (clock, temperature) do not make a lemon
        by_host[r.host].append((kind, r))

    def decay(t: float) -> float:
        if policy.half_life_days <= 0:
            return 1.0
        age_days = max(0.0, now - t) / 86400.0
        return math.pow(0.5, age_days / policy.half_life_days)

    member_counts = {h: sum(1 for k, _ in rows if k == "failed_attempt_member") for h, rows in by_host.items()}
    median_member = statistics.median(member_counts.values()) if member_counts else 0.0
    out: list[HostScore] = []
    for host, rows in by_host.items():
        score = 0.0
        counts: Counter[str] = Counter(k for k, _ in rows)
        details: dict[str, Counter[str]] = defaultdict(Counter)
        incident_keys: set[tuple[str, int]] = set()
        members = sorted((r for k, r in rows if k == "failed_attempt_member"), key=lambda r: r.time)
        excess = max(0, len(members) - math.ceil(median_member))
        for r in members[len(members) - excess:]:
            score += policy.weights.get("failed_attempt_member", 0.0) * decay(r.time)
        for kind, r in rows:
            if kind == "failed_attempt_member":
                continue
            weight = policy.weights.get(kind, 0.0)
            details[kind][r.detail] += 1
            if weight > 0:
                score += weight * decay(r.time)
                incident_keys.add((r.run_id, int(r.time // INCIDENT_WINDOW_SECONDS)))
        incidents = len(incident_keys)
        reasons = _reasons(counts, details, excess, median_member)
        out.append(HostScore(
            host=host, score=round(score, 3),
            flagged=score >= policy.threshold and incidents >= policy.min_incidents,
            reasons=tuple(reasons), counts=dict(counts), incidents=incidents,
            runs=len({r.run_id for _, r in rows}), last_seen=max(r.time for _, r in rows)))
    out.sort(key=lambda s: (-s.score, s.host))
    return out


def _top(c: Counter[str]) -> str:
    return ", ".join(f"{d}" + (f" x{n}" if n > 1 else "") for d, n in c.most_common(3))


def _reasons(counts: Counter[str], details: dict[str, Counter[str]], excess: int, median: float) -> list[str]:
    labels = {
        "culprit": "named culprit", "failure": "named by a failure", "excluded": "excluded",
        "check_failed": "failed high-severity health checks", "check_failed_low": "failed low-severity checks",
        "xid_hardware": "hardware XIDs",
        "xid_application": "application XIDs",
    }
    out = [f"{labels[k]} {counts[k]}x ({_top(details[k])})" for k in labels if counts.get(k)]
    if excess:
        out.append(f"in {counts['failed_attempt_member']} failed attempts (fleet median {median:g})")
    return out


def rank_hosts(db: Any = None, *, policy: LemonPolicy | None = None, now: float | None = None) -> list[HostScore]:
    """Score the hosts of a fleet database: a `FleetDB`, a path or ``postgresql://`` URL, or None for the
    default."""
    from trainguard.health.fleetdb import FleetDB

    if isinstance(db, FleetDB):
        return score_hosts(db.host_history(), policy=policy, now=now)
    with FleetDB(db) as fleet:
        return score_hosts(fleet.host_history(), policy=policy, now=now)


def flagged_hosts(db: Any = None, *, policy: LemonPolicy | None = None) -> set[str]:
    """Hosts the supervisor should avoid: the flagged ones of `rank_hosts`."""
    return {s.host for s in rank_hosts(db, policy=policy) if s.flagged}
