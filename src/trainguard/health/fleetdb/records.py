"""What the fleet database hands back: runs, per-host history rows and the outcome of indexing a run."""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.errors import InputError

HOST_KINDS = ("culprit", "failure", "excluded", "check_failed", "failed_attempt_member", "xid", "drained",
              "drain_refused", "drain_failed", "returned", "link_failed", "link_flapped")
LINK_KINDS = ("link_failed", "link_flapped")
"""Link-level history (detail ``mlx5_3:1 -> node-04``): a pair of a diagnosis's link localization that had
failing lines, or only transient ones (retries, non-fatal errors). Never scored as lemon evidence themselves."""
DRAIN_KINDS = ("drained", "drain_refused", "drain_failed", "returned")
"""Host history of the drain policy (`trainguard.health.drain`): never scored as lemon evidence themselves."""


class FleetDBError(InputError):
    """The database itself is unusable (not SQLite, corrupt, a newer layout, not a fleet database):
    nothing can be indexed."""


@dataclass(frozen=True)
class HostRecord:
    """One thing that happened to a host in some run."""

    host: str
    run_id: str
    """The run's key in the database (`RunRecord.uid`): distinct for distinct runs whatever their ids."""
    time: float
    kind: str
    """One of `HOST_KINDS`."""
    detail: str


@dataclass(frozen=True)
class RunRecord:
    """A run as the database knows it."""

    uid: str
    """The run's key: ``<run_id>@<12 hex>`` from its RunStarted record, or ``anon@<16 hex>`` from its
    content when it has none (see `trainguard.health.fleetdb.run_rows.run_identity`)."""
    run_id: str | None
    """``run_id`` of the RunStarted record; None when the run has none."""
    name: str
    """Folder name when last indexed (a label only: two runs may share it)."""
    path: str
    """Absolute path when last indexed."""
    started: float | None
    ended: float | None
    status: str | None
    synthetic: bool
    events: int


@dataclass(frozen=True)
class IndexResult:
    """What indexing one run directory did."""

    uid: str
    """The run's key (`RunRecord.uid`)."""
    run_id: str | None
    """``run_id`` of its RunStarted record, if any."""
    events: int
    """Records read from the run directory."""
    new_events: int
    """Records not in the database before."""
    skipped: int
    """Records left out because a field the index reads had the wrong type (each logged as a warning)."""
