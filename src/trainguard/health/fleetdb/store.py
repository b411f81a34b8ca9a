"""`FleetDB`: index run directories into the fleet database and read back runs and per-host history.

The same statements run on SQLite and PostgreSQL (`trainguard.health.fleetdb.dialect`). Each run is one
transaction: events are keyed by (run, writer, line) and inserted with ``ON CONFLICT DO NOTHING``, so
indexing a run twice, from a copy, or from many processes and hosts at once neither loses nor duplicates a
record. Answers are sorted here, not by the engine, so both engines give them in one order.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from trainguard.core.rundir import RunDir
from trainguard.errors import InputError, TrainguardError
from trainguard.health.fleetdb.backend import Backend
from trainguard.health.fleetdb.location import Location, is_url, resolve
from trainguard.health.fleetdb.records import DRAIN_KINDS, LINK_KINDS, HostRecord, IndexResult, RunRecord
from trainguard.health.fleetdb.run_rows import RunRows, read_run
from trainguard.health.fleetdb.schema import LEGACY_PREFIX, prepare

log = logging.getLogger(__name__)

# The folder is read before the run's lock is taken, so an indexer may commit a read older than the one
# already stored (it began before the run's end was written): the row only moves forward, never back to "running".
_UPSERT_RUN = (
    "INSERT INTO runs (uid, run_id, name, path, started, ended, status, synthetic, indexed_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (uid) DO UPDATE SET name = excluded.name,"
    " path = excluded.path, started = excluded.started, ended = excluded.ended, status = excluded.status,"
    " synthetic = excluded.synthetic, indexed_at = excluded.indexed_at"
    " WHERE runs.ended IS NULL OR excluded.ended >= runs.ended")
_INSERT_EVENT = ("INSERT INTO events (run_uid, writer, line, type, time, host, body) VALUES (?, ?, ?, ?, ?, ?, ?)"
                 " ON CONFLICT DO NOTHING")
_INSERT_HISTORY = ("INSERT INTO host_history (host, run_uid, time, kind, detail, source_writer, source_line)"
                   " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING")


def _open(where: str | Path, *, busy_timeout_seconds: float, read_only: bool) -> Backend:
    if isinstance(where, str) and is_url(where):
        from trainguard.health.fleetdb.postgres_backend import PostgresBackend

        return PostgresBackend(where, read_only=read_only)
    from trainguard.health.fleetdb.sqlite_backend import SQLiteBackend

    return SQLiteBackend(Path(where), busy_timeout_seconds=busy_timeout_seconds)


class FleetDB:
    """The fleet database at ``path``: a SQLite file (created on first use; a first-layout file is upgraded in
    place) or a ``postgresql://`` URL (its tables are created on first use). None: ``$TRAINGUARD_DB``, else
    the default file.

    ``read_only`` (a server only): never write, and refuse a database trainguard has not written yet. Raises
    `FleetDBError` (an `InputError`) when the database is not a usable fleet database, `StorageError` when it
    cannot be created, reached, opened for writing or written, and `UsageError` for a bad URL.
    """

    def __init__(self, path: Location | None = None, *, busy_timeout_seconds: float = 30.0,
                 read_only: bool = False) -> None:
        where = resolve(path)
        self._db = _open(where, busy_timeout_seconds=busy_timeout_seconds, read_only=read_only)
        self.path: Path | None = self._db.path
        """The file (SQLite); None for a server."""
        self.location = self._db.shown
        """The database as it may be printed: the file, or the URL with its password redacted."""
        try:
            prepare(self._db, read_only=read_only and self.path is None)
        except TrainguardError:
            self._db.close()
            raise

    @property
    def engine(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._db.dialect.name

    @property
    def _conn(self) -> Any:
        """The engine's own connection (tests reach SQLite's pragmas through it)."""
        return self._db.conn

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> FleetDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def index_run(self, run: RunDir | str | os.PathLike[str]) -> int:
        """Index (or re-index) one run directory; returns how many events were new (see `index`)."""
        return self.index(run).new_events

    def index(self, run: RunDir | str | os.PathLike[str]) -> IndexResult:
        """Index (or re-index) one run directory.

        Raises `InputError` when the run cannot be read (the database is left as it was),
        `FleetDBError` when the database is unusable and `StorageError` when it cannot be written.
        """
        rd = run if isinstance(run, RunDir) else RunDir(run)
        r = read_run(rd)
        with self._db.transaction() as db:
            db.dialect.lock_run(db, r.uid)
            self._refuse_other_run(db, rd, r)
            self._drop_legacy(db, r.path)
            db.execute(_UPSERT_RUN, (r.uid, r.run_id, r.name, r.path, r.started, r.ended, r.status,
                                     int(r.synthetic), time.time()))
            new = db.executemany(_INSERT_EVENT, r.events)
            db.executemany(_INSERT_HISTORY, r.history)
        log.info("indexed %s (%s): %d events, %d new", rd.root, r.uid, len(r.events), new)
        return IndexResult(uid=r.uid, run_id=r.run_id, events=len(r.events), new_events=new, skipped=r.skipped)

    @staticmethod
    def _refuse_other_run(db: Backend, rd: RunDir, r: RunRows) -> None:
        """Raise `InputError` when ``r.uid`` is already indexed with *other* records at the same places: a
        different run that shares the key (the same run id, start time and host, as two simulated trials
        written to folders of the same name had), whose events ``ON CONFLICT DO NOTHING`` would silently drop.
        A record counts as the same when its type, time and host are (a newer trainguard may write more
        fields into the body of the same record)."""
        known = db.execute("SELECT path FROM runs WHERE uid = ?", (r.uid,)).fetchone()
        if known is None:
            return
        db.execute(db.dialect.ddl(
            "CREATE TEMP TABLE IF NOT EXISTS incoming (writer TEXT NOT NULL, line {int} NOT NULL,"
            " type TEXT NOT NULL, time {real} NOT NULL, host TEXT NOT NULL, PRIMARY KEY (writer, line))"))
        db.execute("DELETE FROM incoming")
        db.executemany("INSERT INTO incoming (writer, line, type, time, host) VALUES (?, ?, ?, ?, ?)"
                       " ON CONFLICT DO NOTHING", [(e[1], e[2], e[3], e[4], e[5]) for e in r.events])
        differ = db.execute(
            "SELECT COUNT(*) FROM incoming i JOIN events e ON e.run_uid = ? AND e.writer = i.writer"
            " AND e.line = i.line WHERE e.type != i.type OR e.time != i.time OR e.host != i.host",
            (r.uid,)).fetchone()[0]
        db.execute("DELETE FROM incoming")
        if differ:
            raise InputError(
                f"{rd.root}: {differ} of its records differ from those of run {r.uid}, already indexed from "
                f"{known[0]}: two different runs share one key (the same run id, start time and host); nothing "
                "of it was indexed. Give one of them its own run id (--rdzv-id, or a distinct folder name)")

    @staticmethod
    def _drop_legacy(db: Backend, path: str) -> None:
        """Remove the first layout's copy of the run at ``path``: it is being indexed properly now."""
        old = [u for (u,) in db.execute("SELECT uid FROM runs WHERE path = ? AND uid LIKE ?",
                                        (path, LEGACY_PREFIX + "%")).fetchall()]
        for u in old:
            for table, key in (("events", "run_uid"), ("host_history", "run_uid"), ("runs", "uid")):
                db.execute(f"DELETE FROM {table} WHERE {key} = ?", (u,))

    def runs(self) -> list[RunRecord]:
        """Every run, oldest start first (runs without a start first), then by key."""
        with self._db.reading() as db:
            rows: list[Any] = db.execute(
                "SELECT r.uid, r.run_id, r.name, r.path, r.started, r.ended, r.status, r.synthetic,"
                " (SELECT COUNT(*) FROM events e WHERE e.run_uid = r.uid) FROM runs r").fetchall()
        out = [RunRecord(a, b, c, d, e, f, g, bool(h), int(i)) for a, b, c, d, e, f, g, h, i in rows]
        out.sort(key=lambda r: (r.started is not None, r.started or 0.0, r.uid))
        return out

    def event_count(self, run: str | None = None) -> int:
        """Events in the database; with ``run``, of the runs whose key (uid), run_id or folder name is
        ``run`` (ids and folder names may be shared by several runs: then all of them count)."""
        with self._db.reading() as db:
            if run is None:
                return int(db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
            return int(db.execute(
                "SELECT COUNT(*) FROM events WHERE run_uid IN"
                " (SELECT uid FROM runs WHERE uid = ? OR run_id = ? OR name = ?)", (run, run, run)).fetchone()[0])

    def hosts(self) -> list[str]:
        with self._db.reading() as db:
            return sorted(h for (h,) in db.execute("SELECT DISTINCT host FROM host_history").fetchall())

    def drain_history(self, host: str | None = None) -> list[HostRecord]:
        """The drain policy's records (`DRAIN_KINDS`), oldest first: drained, refused, failed, returned."""
        return [r for r in self.host_history(host) if r.kind in DRAIN_KINDS]

    def link_history(self, host: str | None = None) -> list[HostRecord]:
        """Link-level records (`LINK_KINDS`), oldest first."""
        return [r for r in self.host_history(host) if r.kind in LINK_KINDS]

    def host_history(self, host: str | None = None) -> list[HostRecord]:
        """Every host's records (or ``host``'s), oldest first, then by host, kind, detail and run."""
        sql = "SELECT host, run_uid, time, kind, detail FROM host_history"
        args: tuple[str, ...] = ()
        if host is not None:
            sql += " WHERE host = ?"
            args = (host,)
        with self._db.reading() as db:
            out = [HostRecord(*row) for row in db.execute(sql, args).fetchall()]
        out.sort(key=lambda r: (r.time, r.host, r.kind, r.detail, r.run_id))
        return out
