"""The fleet database on a PostgreSQL server (``postgresql://...``), through psycopg 3 (the ``postgres`` extra).

Many hosts and jobs write to it at once; each run is one transaction, as on SQLite. The password is never
printed: the location is shown redacted and the server's messages are scrubbed of it. Without one in the URL,
libpq reads ``PGPASSWORD`` or ``~/.pgpass`` (``PGPASSFILE``) itself.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from trainguard.errors import StorageError, TrainguardError, UsageError
from trainguard.health.fleetdb.backend import Backend
from trainguard.health.fleetdb.dialect import PostgresDialect
from trainguard.health.fleetdb.location import check_url, redact, scrub
from trainguard.health.fleetdb.records import FleetDBError

CONNECT_TIMEOUT_SECONDS = 10
"""How long a connection attempt may take when neither the URL nor ``PGCONNECT_TIMEOUT`` says (libpq's own
default is to wait forever on a server that drops packets)."""
_NOT_OURS = ("42",)
"""SQLSTATE classes that mean the database's tables are not what trainguard wrote (syntax error or access
rule violation: a missing table or column), not that the server failed."""
_STORAGE = ("42501",)
"""...except insufficient privilege: the database cannot be written by this user."""


def _driver() -> Any:
    try:
        return importlib.import_module("psycopg")
    except ImportError:
        raise UsageError("a postgresql:// fleet database needs psycopg: pip install 'trainguard[postgres]'") from None


def one_line(text: str) -> str:
    """A server message (``ERROR ...`` with DETAIL and HINT lines) as one line."""
    return " ".join(part.strip() for part in text.strip().splitlines() if part.strip())


class PostgresBackend(Backend):
    """A connection to the database of ``url`` (autocommit; `transaction` groups statements)."""

    dialect = PostgresDialect()

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        self.url = url
        self.shown = redact(url)
        check_url(url)
        psycopg = _driver()
        self._native = psycopg.Error
        kwargs: dict[str, Any] = {"autocommit": True, "application_name": "trainguard"}
        try:
            given = psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise UsageError(f"bad fleet database URL {self.shown}: {scrub(one_line(str(exc)), url)}") from None
        if "connect_timeout" not in given and not os.environ.get("PGCONNECT_TIMEOUT"):
            kwargs["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
        try:
            conn = psycopg.connect(url, **kwargs)
        except psycopg.Error as exc:
            raise StorageError(f"{self.shown}: cannot connect to the fleet database "
                               f"({scrub(one_line(str(exc)), url)})") from None
        super().__init__(conn)
        if read_only:  # the dashboard, `hosts` and the lemon check: a bug can never write
            try:
                conn.execute("SET default_transaction_read_only = on")
            except psycopg.Error as exc:
                self.close()
                raise self.error(exc, "open") from None

    def error(self, exc: BaseException, doing: str) -> TrainguardError:
        state = getattr(exc, "sqlstate", None) or ""
        text = scrub(one_line(str(exc)), self.url)
        if state.startswith(_NOT_OURS) and state not in _STORAGE:
            return FleetDBError(f"{self.shown}: not a usable fleet database ({text})")
        return StorageError(f"{self.shown}: cannot {doing} the fleet database ({text})")
