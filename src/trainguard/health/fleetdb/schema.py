"""The fleet database's layout and its migrations: one copy, for SQLite and PostgreSQL alike.

The version lives where the engine keeps such things (`trainguard.health.fleetdb.dialect`); opening a
database brings it to `SCHEMA_VERSION` in one transaction, under the layout lock, so that many processes
opening a new database at once create it once. A layout newer than this trainguard is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from trainguard.health.fleetdb.backend import Backend
from trainguard.health.fleetdb.records import FleetDBError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
"""The current layout. Version 0 with a ``runs`` table (SQLite only) is the first layout, which keyed runs by
folder name; it is upgraded in place on open."""
LEGACY_PREFIX = "legacy:"
"""Key prefix of runs carried over from the first layout (keyed by folder name); such a run is replaced
when its folder is indexed again."""
TABLES = ("runs", "events", "host_history")

# Type tokens: {real} an 8-byte float, {int} an integer (the engines' names differ: Dialect.types).
_LAYOUT_2 = (
    """CREATE TABLE IF NOT EXISTS runs (
        uid TEXT PRIMARY KEY,
        run_id TEXT,
        name TEXT NOT NULL,
        path TEXT NOT NULL,
        started {real},
        ended {real},
        status TEXT,
        synthetic {int} NOT NULL DEFAULT 0,
        indexed_at {real} NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS runs_by_run_id ON runs (run_id)",
    """CREATE TABLE IF NOT EXISTS events (
        run_uid TEXT NOT NULL,
        writer TEXT NOT NULL,
        line {int} NOT NULL,
        type TEXT NOT NULL,
        time {real} NOT NULL,
        host TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (run_uid, writer, line)
    )""",
    "CREATE INDEX IF NOT EXISTS events_by_type ON events (type, run_uid)",
    """CREATE TABLE IF NOT EXISTS host_history (
        host TEXT NOT NULL,
        run_uid TEXT NOT NULL,
        time {real} NOT NULL,
        kind TEXT NOT NULL,
        detail TEXT NOT NULL,
        source_writer TEXT NOT NULL,
        source_line {int} NOT NULL,
        PRIMARY KEY (host, run_uid, source_writer, source_line, kind, detail)
    )""",
)


def _to_layout_2(db: Backend, tables: set[str]) -> None:
    """Create layout 2; a first-layout database's rows are carried over under ``legacy:<folder name>`` keys
    (its runs were keyed by folder name, so runs that shared one are already merged; re-indexing the folder
    replaces them)."""
    legacy = "runs" in tables
    if legacy:
        log.info("%s: upgrading the fleet database to layout 2", db.shown)
        db.execute("DROP INDEX IF EXISTS events_by_type")
        for t in TABLES:
            if t in tables:
                db.execute(f"ALTER TABLE {t} RENAME TO {t}_v1")
    for stmt in _LAYOUT_2:
        db.execute(db.dialect.ddl(stmt))
    if not legacy:
        return
    db.execute("INSERT INTO runs (uid, run_id, name, path, started, ended, status, synthetic, indexed_at)"
               " SELECT ? || run_id, NULL, run_id, path, started, ended, status, synthetic, indexed_at FROM runs_v1"
               " WHERE true ON CONFLICT DO NOTHING", (LEGACY_PREFIX,))
    if "events" in tables:
        db.execute("INSERT INTO events SELECT ? || run_id, writer, line, type, time, host, body FROM events_v1"
                   " WHERE true ON CONFLICT DO NOTHING", (LEGACY_PREFIX,))
    if "host_history" in tables:
        db.execute("INSERT INTO host_history SELECT host, ? || run_id, time, kind, detail, source_writer,"
                   " source_line FROM host_history_v1 WHERE true ON CONFLICT DO NOTHING", (LEGACY_PREFIX,))
    for t in TABLES:
        if t in tables:
            db.execute(f"DROP TABLE {t}_v1")


@dataclass(frozen=True)
class Migration:
    """One step of the layout."""

    version: int
    """The layout this step makes."""
    apply: Callable[[Backend, set[str]], None]
    """Run inside the layout transaction with the tables that existed before it."""


MIGRATIONS = (Migration(2, _to_layout_2),)
"""In order; the last one's version is `SCHEMA_VERSION`. A new layout is a new step here, for both engines."""


def _check(db: Backend, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise FleetDBError(f"{db.shown}: fleet database layout {version} is newer than this trainguard "
                           f"supports ({SCHEMA_VERSION}); upgrade trainguard")


def prepare(db: Backend, *, read_only: bool = False) -> None:
    """Bring the database to `SCHEMA_VERSION` (``read_only``: only check that it is there).

    Raises `FleetDBError` for a newer layout, a server database with a ``runs`` table of somebody else's,
    or (``read_only``) a database trainguard never wrote."""
    with db.reading():
        version = db.dialect.read_version(db)
    _check(db, version)
    if version == SCHEMA_VERSION:
        return
    if read_only:
        raise FleetDBError(f"{db.shown}: not a fleet database yet (index runs first: trainguard index RUN_DIR)")
    with db.transaction():
        db.dialect.lock_layout(db)
        # re-read under the lock: another process may have created or upgraded it meanwhile
        version = db.dialect.read_version(db)
        _check(db, version)
        if version == SCHEMA_VERSION:
            return
        tables = db.dialect.tables(db)
        if version == 0 and "runs" in tables and not db.dialect.legacy_layouts:
            raise FleetDBError(f"{db.shown}: holds a 'runs' table that trainguard did not create; give the fleet "
                               "database a database of its own")
        for step in MIGRATIONS:
            if step.version > version:
                step.apply(db, tables)
        db.dialect.write_version(db, SCHEMA_VERSION)
