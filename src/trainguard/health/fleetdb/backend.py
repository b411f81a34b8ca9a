"""One open connection to a fleet database, whichever engine: statements, transactions and errors.

`FleetDB` and the layout (`trainguard.health.fleetdb.schema`) talk to a `Backend` only; the SQLite and
PostgreSQL backends differ in how they connect and in which engine errors mean what to the user.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from trainguard.errors import TrainguardError
from trainguard.health.fleetdb.dialect import Dialect


class Backend:
    """A connection in autocommit mode; `transaction` groups statements, `reading` maps a failed read."""

    dialect: Dialect
    shown: str
    """The database as it may be printed (a URL's password redacted)."""
    path: Path | None = None
    """The file (SQLite); None for a server."""
    _native: type[BaseException] = Exception
    """The engine's error class that `error` maps."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self.conn.execute(self.dialect.sql(sql), tuple(args))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run ``sql`` for every row; how many rows it changed (an ignored conflict changes none)."""
        if not rows:
            return 0
        cur = self.conn.cursor()
        try:
            cur.executemany(self.dialect.sql(sql), rows)
            return int(cur.rowcount)
        finally:
            cur.close()

    def error(self, exc: BaseException, doing: str) -> TrainguardError:
        """The user-facing error for an engine failure while ``doing`` (open, read, write, commit to)."""
        raise NotImplementedError

    @contextmanager
    def transaction(self) -> Iterator[Backend]:
        """One transaction, rolled back when anything in it fails; engine errors become `TrainguardError`."""
        try:
            self.conn.execute(self.begin_statement)
        except self._native as exc:
            raise self.error(exc, "write") from None
        try:
            yield self
        except BaseException as exc:
            with suppress(self._native):  # a failed write may already have rolled the transaction back
                self.conn.execute("ROLLBACK")
            if isinstance(exc, self._native):
                raise self.error(exc, "write") from None
            raise
        else:
            try:
                self.conn.execute("COMMIT")
            except self._native as exc:
                with suppress(self._native):
                    self.conn.execute("ROLLBACK")
                raise self.error(exc, "commit to") from None

    begin_statement = "BEGIN"

    @contextmanager
    def reading(self) -> Iterator[Backend]:
        try:
            yield self
        except self._native as exc:
            raise self.error(exc, "read") from None

    def close(self) -> None:
        with suppress(self._native):
            self.conn.close()
