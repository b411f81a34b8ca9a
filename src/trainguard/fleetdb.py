"""The fleet database: one SQLite file indexing runs, their events and per-host history.

It is an index, never the source of truth: everything in it can be rebuilt from run directories
(``trainguard index RUNS...``). Each event is keyed by (run, writer, line), so indexing the same run
twice, or from several processes at once, neither loses nor duplicates a record. WAL mode lets
readers (reports, the dashboard) work while writers index.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trainguard.errors import InputError, StorageError
from trainguard.events import (
    AttemptEnded,
    AttemptStarted,
    Diagnosis,
    FailureDetected,
    HealthCheckResult,
    NodeExcluded,
    RunEnded,
    RunStarted,
)
from trainguard.rundir import LoadedEvent, RunDir

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    started REAL,
    ended REAL,
    status TEXT,
    synthetic INTEGER NOT NULL DEFAULT 0,
    indexed_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    writer TEXT NOT NULL,
    line INTEGER NOT NULL,
    type TEXT NOT NULL,
    time REAL NOT NULL,
    host TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (run_id, writer, line)
);
CREATE INDEX IF NOT EXISTS events_by_type ON events (type, run_id);
CREATE TABLE IF NOT EXISTS host_history (
    host TEXT NOT NULL,
    run_id TEXT NOT NULL,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    source_writer TEXT NOT NULL,
    source_line INTEGER NOT NULL,
    PRIMARY KEY (host, run_id, source_writer, source_line, kind, detail)
);
"""

_XID = re.compile(r"\bXid\b\s*(?:\([^)]*\))?\s*:\s*(\d+)", re.IGNORECASE)
HOST_KINDS = ("culprit", "failure", "excluded", "check_failed", "failed_attempt_member", "xid")


@dataclass(frozen=True)
class HostRecord:
    """One thing that happened to a host in some run."""

    host: str
    run_id: str
    time: float
    kind: str
    """One of `HOST_KINDS`."""
    detail: str


@dataclass(frozen=True)
class RunRecord:
    """A run as the database knows it."""

    run_id: str
    path: str
    started: float | None
    ended: float | None
    status: str | None
    synthetic: bool
    events: int


def default_db_path() -> Path:
    """``$TRAINGUARD_DB``, else ``$XDG_DATA_HOME/trainguard/fleet.db`` (``~/.local/share`` by default)."""
    env = os.environ.get("TRAINGUARD_DB")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "trainguard" / "fleet.db"


def _host_records(run_id: str, loaded: list[LoadedEvent]) -> Iterator[tuple[str, str, float, str, str, str, int]]:
    """Per-host history rows derived from a run's events."""
    attempt_hosts: dict[int, tuple[str, ...]] = {}
    for item in loaded:
        e = item.record
        if isinstance(e, AttemptStarted):
            attempt_hosts[e.attempt] = e.hosts
    for item in loaded:
        e, w, n = item.record, item.writer, item.line
        if isinstance(e, Diagnosis):
            for h in e.culprit_hosts:
                yield (h, run_id, e.time, "culprit", e.category, w, n)
                for line in e.evidence:
                    m = _XID.search(line)
                    if m:
                        yield (h, run_id, e.time, "xid", m.group(1), w, n)
        elif isinstance(e, FailureDetected):
            for h in e.hosts:
                yield (h, run_id, e.time, "failure", e.kind, w, n)
        elif isinstance(e, NodeExcluded):
            yield (e.node, run_id, e.time, "excluded", e.reason, w, n)
        elif isinstance(e, HealthCheckResult) and not e.ok and not e.skipped:
            yield (e.host, run_id, e.time, "check_failed", f"{e.name} ({e.severity})", w, n)
        elif isinstance(e, AttemptEnded) and e.reason == "failure":
            for h in attempt_hosts.get(e.attempt, ()):
                yield (h, run_id, e.time, "failed_attempt_member", f"attempt {e.attempt}", w, n)


class FleetDB:
    """The fleet database at ``path`` (created on first use)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, busy_timeout_seconds: float = 30.0) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_seconds, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise InputError(f"{self.path}: not a usable fleet database ({exc})") from None
        except OSError as exc:
            raise StorageError(f"{self.path}: cannot create the fleet database ({exc.strerror})") from None

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> FleetDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front, so concurrent indexers queue instead of
        # failing half-way with "database is locked".
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StorageError(f"{self.path}: cannot write the fleet database ({exc})") from None
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        else:
            try:
                self._conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                raise StorageError(f"{self.path}: cannot commit to the fleet database ({exc})") from None

    def index_run(self, run: RunDir | str | os.PathLike[str]) -> int:
        """Index (or re-index) one run directory; returns how many events were new."""
        rd = run if isinstance(run, RunDir) else RunDir(run)
        loaded = rd.load()
        run_id = rd.run_id
        started = ended = None
        status = None
        synthetic = False
        for item in loaded:
            e = item.record
            if isinstance(e, RunStarted):
                started, synthetic = e.time, e.synthetic
            elif isinstance(e, RunEnded):
                ended, status = e.time, e.status
        rows = [
            (run_id, it.writer, it.line, it.record.TYPE, it.record.time, it.record.host,
             json.dumps(it.record.to_dict(), separators=(",", ":")))
            for it in loaded
        ]
        with self._transaction() as db:
            db.execute(
                "INSERT INTO runs (run_id, path, started, ended, status, synthetic, indexed_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(run_id) DO UPDATE SET path=excluded.path,"
                " started=excluded.started, ended=excluded.ended, status=excluded.status,"
                " synthetic=excluded.synthetic, indexed_at=excluded.indexed_at",
                (run_id, str(rd.root.resolve()), started, ended, status, int(synthetic), time.time()),
            )
            before = db.total_changes
            db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            new = db.total_changes - before
            db.executemany(
                "INSERT OR IGNORE INTO host_history VALUES (?, ?, ?, ?, ?, ?, ?)",
                list(_host_records(run_id, loaded)),
            )
        log.info("indexed %s: %d events, %d new", run_id, len(rows), new)
        return new

    def runs(self) -> list[RunRecord]:
        cur = self._conn.execute(
            "SELECT r.run_id, r.path, r.started, r.ended, r.status, r.synthetic,"
            " (SELECT COUNT(*) FROM events e WHERE e.run_id = r.run_id)"
            " FROM runs r ORDER BY r.started"
        )
        return [RunRecord(a, b, c, d, e, bool(f), g) for a, b, c, d, e, f, g in cur.fetchall()]

    def event_count(self, run_id: str | None = None) -> int:
        if run_id is None:
            return int(self._conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
        return int(self._conn.execute("SELECT COUNT(*) FROM events WHERE run_id = ?", (run_id,)).fetchone()[0])

    def hosts(self) -> list[str]:
        cur = self._conn.execute("SELECT DISTINCT host FROM host_history ORDER BY host")
        return [h for (h,) in cur.fetchall()]

    def host_history(self, host: str | None = None) -> list[HostRecord]:
        sql = "SELECT host, run_id, time, kind, detail FROM host_history"
        args: tuple[str, ...] = ()
        if host is not None:
            sql += " WHERE host = ?"
            args = (host,)
        cur = self._conn.execute(sql + " ORDER BY time, host, kind", args)
        return [HostRecord(*row) for row in cur.fetchall()]
