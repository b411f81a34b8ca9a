"""The embedded fleet database: one SQLite file in WAL mode (readers work while one writer indexes)."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

from trainguard.errors import StorageError, TrainguardError
from trainguard.health.fleetdb.backend import Backend
from trainguard.health.fleetdb.dialect import Dialect
from trainguard.health.fleetdb.records import FleetDBError

# sqlite error names (Python 3.11+ puts them on the exception) that mean "this file is not a usable
# database"; every other failure of the engine (full, read-only, I/O, locked, cannot open) is storage.
_BAD_FILE_ERRORS = ("SQLITE_NOTADB", "SQLITE_CORRUPT")


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
            conn.execute("PRAGMA journal_mode=WAL")
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
