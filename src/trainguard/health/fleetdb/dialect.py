"""The few places the fleet database's SQL differs between SQLite and PostgreSQL, and nothing else.

Every statement is written once, in the SQL both engines share (``INSERT ... ON CONFLICT DO NOTHING``,
``ON CONFLICT (...) DO UPDATE SET x = excluded.x``, ``NULLS FIRST``), with ``?`` placeholders and type
tokens in the layout (``{real}``, ``{int}``); a `Dialect` supplies the rest: its placeholder, its type
names, where the layout version is kept, how the tables are listed and the locks that serialize writers.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar, Protocol


class Executor(Protocol):
    """What a dialect runs its statements through (a `trainguard.health.fleetdb.backend.Backend`, which puts
    in the dialect's placeholders)."""

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> Any: ...


class Dialect:
    """SQLite: the embedded default. The layout version is ``PRAGMA user_version``; ``BEGIN IMMEDIATE``
    already serializes writers, so no lock statement is needed."""

    name = "sqlite"
    types: ClassVar[dict[str, str]] = {"real": "REAL", "int": "INTEGER"}
    legacy_layouts = True
    """Whether a database without a version but with a ``runs`` table is the first layout (SQLite only:
    that layout never existed on a server, where such a table is somebody else's)."""

    def sql(self, text: str) -> str:
        """``text`` with this engine's placeholders."""
        return text

    def ddl(self, text: str) -> str:
        """A layout statement with this engine's type names."""
        return text.format(**self.types)

    def read_version(self, db: Executor) -> int:
        return int(db.execute("PRAGMA user_version").fetchone()[0])

    def write_version(self, db: Executor, version: int) -> None:
        db.execute(f"PRAGMA user_version = {int(version)}")

    def tables(self, db: Executor) -> set[str]:
        return {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()}

    def lock_layout(self, db: Executor) -> None:
        """Hold writers of the layout off until this transaction ends."""

    def lock_run(self, db: Executor, uid: str) -> None:
        """Hold other indexers of run ``uid`` off until this transaction ends."""


_LAYOUT_LOCK = 0x7472_6700_0000_0001  # "trg" + 1: one advisory lock key for layout changes
VERSION_TABLE = "trainguard_layout"
"""PostgreSQL's equivalent of ``PRAGMA user_version``: one row, the layout version."""


class PostgresDialect(Dialect):
    """PostgreSQL: ``%s`` placeholders, 8-byte numbers (``REAL`` is 4 bytes there: seconds since 1970 would
    lose their fraction), the version in `VERSION_TABLE`, and transaction-scoped advisory locks where
    SQLite's database-wide write lock served."""

    name = "postgresql"
    types: ClassVar[dict[str, str]] = {"real": "DOUBLE PRECISION", "int": "BIGINT"}
    legacy_layouts = False

    def sql(self, text: str) -> str:
        # The statements hold no literal % or ? of their own (patterns travel as parameters).
        return text.replace("?", "%s")

    def read_version(self, db: Executor) -> int:
        # Asked of information_schema (a plain snapshot), not to_regclass: after waiting on the advisory lock,
        # the catalog cache can still miss a table that the lock's previous holder created.
        if VERSION_TABLE not in self.tables(db):
            return 0
        row = db.execute(f"SELECT MAX(version) FROM {VERSION_TABLE}").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def write_version(self, db: Executor, version: int) -> None:
        db.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER NOT NULL)")
        db.execute(f"DELETE FROM {VERSION_TABLE}")
        db.execute(f"INSERT INTO {VERSION_TABLE} (version) VALUES (?)", (int(version),))

    def tables(self, db: Executor) -> set[str]:
        rows = db.execute("SELECT table_name FROM information_schema.tables"
                          " WHERE table_schema = current_schema()").fetchall()
        return {n for (n,) in rows}

    def lock_layout(self, db: Executor) -> None:
        db.execute("SELECT pg_advisory_xact_lock(?)", (_LAYOUT_LOCK,))

    def lock_run(self, db: Executor, uid: str) -> None:
        # Two indexers of one run would both find it new and both skip the shared-key check.
        key = int.from_bytes(hashlib.sha256(uid.encode("utf-8")).digest()[:8], "big", signed=True)
        db.execute("SELECT pg_advisory_xact_lock(?)", (key,))
