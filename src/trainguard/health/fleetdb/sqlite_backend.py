"""The embedded fleet database: one SQLite file in WAL mode (readers work while one writer indexes)."""

from __future__ import annotations

import sqlite3
import stat
import time
from pathlib import Path

from trainguard.errors import StorageError, TrainguardError
from trainguard.health.fleetdb.backend import Backend
from trainguard.health.fleetdb.dialect import Dialect
from trainguard.health.fleetdb.records import FleetDBError

# sqlite error names (Python 3.11+ puts them on the exception) that mean "this file is not a usable
# database"; every other failure of the engine (full, read-only, I/O, locked, cannot open) is storage.
_BAD_FILE_ERRORS = ("SQLITE_NOTADB", "SQLITE_CORRUPT")
WAL_RETRY_SECONDS = 0.05
"""Pause between tries at turning a file to WAL while another connection writes to it."""


class SQLiteBackend(Backend):
    """The file at ``path``, created with its folder on first use."""

    dialect = Dialect()
    _native = sqlite3.Error
    # BEGIN IMMEDIATE takes the write lock up front, so concurrent indexers queue instead of
    # failing half-way with "database is locked".
    begin_statement = "BEGIN IMMEDIATE"

    def __init__(self, path: Path, *, busy_timeout_seconds: float) -> None:
        self.path = path
        self.shown = str(path)
        _check_file(path)
        try:
            conn = sqlite3.connect(path, timeout=busy_timeout_seconds, isolation_level=None)
        except sqlite3.Error as exc:
            raise self.error(exc, "open") from None
        super().__init__(conn)
        try:
            _to_wal(conn, time.monotonic() + busy_timeout_seconds)
            conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            conn.close()
            raise self.error(exc, "open") from None

    def error(self, exc: BaseException, doing: str) -> TrainguardError:
        name = getattr(exc, "sqlite_errorname", "") or ""
        text = str(exc)
        if name.startswith(_BAD_FILE_ERRORS) or "not a database" in text or "malformed" in text:
            return FleetDBError(f"{self.path}: not a usable fleet database ({text})")
        return StorageError(f"{self.path}: cannot {doing} the fleet database ({text})")


def _to_wal(conn: sqlite3.Connection, deadline: float) -> None:
    """Put the file in WAL mode (kept in the file: once done, only read here). Turning it needs the file to
    itself, and SQLite does not call the busy handler for that: while another connection writes, the pragma fails
    at once with "database is locked" (a CI run's many writers opening one new file did). So it is tried again
    until ``deadline`` (the busy timeout), and a file another connection turned meanwhile is taken as it is."""
    while True:
        if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            return
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(WAL_RETRY_SECONDS)


def _check_file(path: Path) -> None:
    """Refuse what is not a file before SQLite opens it; create the missing folders."""
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise StorageError(f"{path}: cannot open the fleet database ({exc.strerror or exc})") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise FleetDBError(f"{path}: is a directory, not a fleet database")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise FleetDBError(f"{path}: not a regular file, not a fleet database")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"{path}: cannot create the fleet database ({exc.strerror or exc})") from None
