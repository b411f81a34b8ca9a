"""The fleet database: one SQLite file indexing runs, their events and per-host history.

It is an index, never the source of truth: everything in it can be rebuilt from run directories
(``trainguard index RUNS...``). A run is known by its content, never its folder name (see
`run_identity`), and each event by (run, writer, line), so indexing the same run twice, from a copy,
or from several processes at once neither loses nor duplicates a record, and two runs in folders of
the same name stay apart. WAL mode lets readers (reports, the dashboard) work while writers index.
See docs/fleetdb.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    Diagnosis,
    Event,
    FailureDetected,
    HealthCheckResult,
    NodeDrained,
    NodeExcluded,
    NodeReturned,
    RunEnded,
    RunStarted,
)
from trainguard.core.rundir import LoadedEvent, RunDir
from trainguard.errors import InputError, StorageError, TrainguardError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
"""``PRAGMA user_version`` of the current layout. Version 0 with a ``runs`` table is the first layout,
which keyed runs by folder name; it is upgraded in place on open (see `FleetDB`)."""

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runs (
        uid TEXT PRIMARY KEY,
        run_id TEXT,
        name TEXT NOT NULL,
        path TEXT NOT NULL,
        started REAL,
        ended REAL,
        status TEXT,
        synthetic INTEGER NOT NULL DEFAULT 0,
        indexed_at REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS runs_by_run_id ON runs (run_id)",
    """CREATE TABLE IF NOT EXISTS events (
        run_uid TEXT NOT NULL,
        writer TEXT NOT NULL,
        line INTEGER NOT NULL,
        type TEXT NOT NULL,
        time REAL NOT NULL,
        host TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (run_uid, writer, line)
    )""",
    "CREATE INDEX IF NOT EXISTS events_by_type ON events (type, run_uid)",
    """CREATE TABLE IF NOT EXISTS host_history (
        host TEXT NOT NULL,
        run_uid TEXT NOT NULL,
        time REAL NOT NULL,
        kind TEXT NOT NULL,
        detail TEXT NOT NULL,
        source_writer TEXT NOT NULL,
        source_line INTEGER NOT NULL,
        PRIMARY KEY (host, run_uid, source_writer, source_line, kind, detail)
    )""",
)
LEGACY_PREFIX = "legacy:"
"""Key prefix of runs carried over from the first layout (keyed by folder name); such a run is replaced
when its folder is indexed again."""

HOST_KINDS = ("culprit", "failure", "excluded", "check_failed", "failed_attempt_member", "xid", "drained",
              "drain_refused", "drain_failed", "returned", "link_failed", "link_flapped")
LINK_KINDS = ("link_failed", "link_flapped")
"""Link-level history (detail ``mlx5_3:1 -> node-04``): a pair of a diagnosis's link localization that had
failing lines, or only transient ones (retries, non-fatal errors). Never scored as lemon evidence themselves."""
DRAIN_KINDS = ("drained", "drain_refused", "drain_failed", "returned")
"""Host history of the drain policy (`trainguard.health.drain`): never scored as lemon evidence themselves."""
_DRAIN_STATUS_KINDS = {"drained": "drained", "refused": "drain_refused", "failed": "drain_failed"}
# sqlite error names (Python 3.11+ puts them on the exception) that mean "this file is not a usable
# database"; every other failure of the engine (full, read-only, I/O, locked, cannot open) is storage.
_BAD_FILE_ERRORS = ("SQLITE_NOTADB", "SQLITE_CORRUPT")


class FleetDBError(InputError):
    """The database file itself is unusable (not SQLite, corrupt, a newer layout): nothing can be indexed."""


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
    content when it has none (see `run_identity`)."""
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


def default_db_path() -> Path:
    """``$TRAINGUARD_DB``, else ``$XDG_DATA_HOME/trainguard/fleet.db`` (``~/.local/share`` by default)."""
    env = os.environ.get("TRAINGUARD_DB")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "trainguard" / "fleet.db"


def _text(value: str) -> str:
    """``value`` as text SQLite accepts: lone surrogates (undecodable file names, ``"\ud800"`` in JSON)
    cannot be encoded to UTF-8 and would fail the insert, so they are written as escapes."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


# Fields the index reads, per record type, with the type each must have. The event reader checks
# records against their schema; this guards the index on its own, so a wrong-typed field can only
# ever cost that one record, never the run or the database.
_STR, _INT, _BOOL, _STRS = "a string", "an integer", "a boolean", "a list of strings"
_FIELDS: dict[type[Event], dict[str, str]] = {
    RunStarted: {"run_id": _STR, "synthetic": _BOOL},
    RunEnded: {"status": _STR},
    AttemptStarted: {"attempt": _INT, "hosts": _STRS},
    AttemptEnded: {"attempt": _INT, "reason": _STR},
    Diagnosis: {"category": _STR, "culprit_hosts": _STRS, "evidence": _STRS},
    FailureDetected: {"kind": _STR, "hosts": _STRS},
    NodeExcluded: {"node": _STR, "reason": _STR},
    HealthCheckResult: {"name": _STR, "severity": _STR, "ok": _BOOL, "skipped": _BOOL},
    NodeDrained: {"node": _STR, "status": _STR, "reason": _STR, "detail": _STR},
    NodeReturned: {"node": _STR, "drained_reason": _STR},
}


def _has_type(value: object, kind: str) -> bool:
    if kind == _STR:
        return isinstance(value, str)
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value)


def _problem(record: Event) -> str | None:
    """Why the index cannot use ``record`` (a wrong-typed field), or None."""
    t = record.time
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(float(t)) or abs(t) > 1e15:
        return "time must be a finite number of seconds"
    if not isinstance(record.host, str):
        return "host must be a string"
    for name, kind in _FIELDS.get(type(record), {}).items():
        if not _has_type(getattr(record, name), kind):
            return f"{name} must be {kind}"
    return None


def _usable(rd: RunDir, loaded: list[LoadedEvent]) -> tuple[list[LoadedEvent], int]:
    """The records the index can use, and how many were left out (each with a warning)."""
    out: list[LoadedEvent] = []
    for item in loaded:
        why = _problem(item.record)
        if why is None:
            out.append(item)
        else:
            log.warning("%s: %s:%d: %s record skipped: %s", rd.root, item.writer, item.line,
                        item.record.TYPE, why)
    return out, len(loaded) - len(out)


def _raw_line(rd: RunDir, writer: str, line: int) -> bytes:
    """The bytes of one record as written (stable whatever this version of trainguard parses)."""
    try:
        with (rd.events_dir / f"{writer}.jsonl").open("rb") as f:
            for n, raw in enumerate(f, 1):
                if n == line:
                    return raw.rstrip(b"\r\n")
    except OSError as exc:
        raise InputError(f"{rd.root}: cannot read {writer}.jsonl: {exc.strerror or exc}") from None
    return b""


def run_identity(rd: RunDir, loaded: list[LoadedEvent]) -> tuple[str, str | None]:
    """The run's key and its ``run_id``: never the folder name, which different runs may share.

    With a RunStarted record (the earliest, if several): ``<run_id>@`` and 12 hex digits of a hash of
    its run_id, time and host, so two runs that reused one id (the default id is the folder name) still
    differ. Without one: ``anon@`` and 16 hex digits of a hash of the earliest record's writer and bytes,
    which stay the same as the run grows (records are only appended). The same run copied elsewhere
    gets the same key.
    """
    starts = [it for it in loaded if isinstance(it.record, RunStarted)]
    if starts:
        first = min(starts, key=lambda it: (it.record.time, it.writer, it.line))
        rs = first.record
        assert isinstance(rs, RunStarted)
        material = json.dumps(["run_started", rs.run_id, rs.time, rs.host], separators=(",", ":"))
        digest = hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()
        return _text(f"{rs.run_id}@{digest[:12]}"), _text(rs.run_id)
    first = min(loaded, key=lambda it: (it.record.time, it.writer, it.line))
    h = hashlib.sha256(b"first_record\0")
    h.update(first.writer.encode("utf-8", "surrogateescape") + b"\0")
    h.update(_raw_line(rd, first.writer, first.line))
    return f"anon@{h.hexdigest()[:16]}", None


def _xid_codes(lines: tuple[str, ...]) -> list[int]:
    """XID codes in a diagnosis's evidence lines, read with the classifier's XID pattern (the one parser)."""
    from trainguard.classify import xid_code  # the rules load on the first diagnosis, not on import

    return [code for code in map(xid_code, lines) if code is not None]


def _link_records(lines: tuple[str, ...]) -> Iterator[tuple[str, str, str]]:
    """(host, kind, detail) of the ``link-pair:`` lines of a diagnosis's evidence (the classifier's parser)."""
    from trainguard.classify import parse_link_evidence

    for line in lines:
        if line.startswith("link-pair: "):
            got = parse_link_evidence(line)
            if got is not None:
                host, detail, fatal, _ = got
                yield host, "link_failed" if fatal else "link_flapped", detail


def _host_records(run_uid: str, loaded: list[LoadedEvent]) -> Iterator[tuple[str, str, float, str, str, str, int]]:
    """Per-host history rows derived from a run's (type-checked) events."""
    attempt_hosts = {e.record.attempt: tuple(e.record.hosts) for e in loaded if isinstance(e.record, AttemptStarted)}
    for item in loaded:
        w, n, t = _text(item.writer), item.line, float(item.record.time)
        for host, kind, detail in _event_history(item.record, attempt_hosts):
            yield (_text(host), run_uid, t, kind, _text(detail), w, n)


def _event_history(e: Event, attempt_hosts: dict[int, tuple[str, ...]]) -> Iterator[tuple[str, str, str]]:
    """(host, kind, detail) of what one event says about hosts."""
    if isinstance(e, Diagnosis):
        for h in e.culprit_hosts:
            yield h, "culprit", e.category
            for code in _xid_codes(e.evidence):
                yield h, "xid", str(code)
        yield from _link_records(e.evidence)
    elif isinstance(e, FailureDetected):
        for h in e.hosts:
            yield h, "failure", e.kind
    elif isinstance(e, NodeExcluded):
        yield e.node, "excluded", e.reason
    elif isinstance(e, HealthCheckResult) and not e.ok and not e.skipped:
        yield e.host, "check_failed", f"{e.name} ({e.severity})"
    elif isinstance(e, NodeDrained) and e.status in _DRAIN_STATUS_KINDS:
        yield e.node, _DRAIN_STATUS_KINDS[e.status], e.reason if e.status == "drained" else f"{e.reason} [{e.detail}]"
    elif isinstance(e, NodeReturned):
        yield e.node, "returned", e.drained_reason
    elif isinstance(e, AttemptEnded) and e.reason == "failure":
        for h in attempt_hosts.get(e.attempt, ()):
            yield h, "failed_attempt_member", f"attempt {e.attempt}"


class FleetDB:
    """The fleet database at ``path`` (created on first use; a first-layout file is upgraded in place).

    Raises `FleetDBError` (an `InputError`) when the file is not a usable fleet database and
    `StorageError` when it cannot be created, opened for writing or written.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, busy_timeout_seconds: float = 30.0) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        try:
            st = self.path.stat()
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise StorageError(f"{self.path}: cannot open the fleet database ({exc.strerror or exc})") from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise FleetDBError(f"{self.path}: is a directory, not a fleet database")
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise FleetDBError(f"{self.path}: not a regular file, not a fleet database")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"{self.path}: cannot create the fleet database ({exc.strerror or exc})") from None
        try:
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_seconds, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._error(exc, "open") from None
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._prepare_schema()
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._error(exc, "open") from None
        except TrainguardError:
            self._conn.close()
            raise

    def _error(self, exc: sqlite3.Error, doing: str) -> TrainguardError:
        """The user-facing error for an sqlite failure while ``doing`` (open, read, write)."""
        name = getattr(exc, "sqlite_errorname", "") or ""
        text = str(exc)
        if name.startswith(_BAD_FILE_ERRORS) or "not a database" in text or "malformed" in text:
            return FleetDBError(f"{self.path}: not a usable fleet database ({text})")
        return StorageError(f"{self.path}: cannot {doing} the fleet database ({text})")

    def _prepare_schema(self) -> None:
        version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise FleetDBError(f"{self.path}: fleet database layout {version} is newer than this trainguard "
                               f"supports ({SCHEMA_VERSION}); upgrade trainguard")
        with self._transaction() as db:
            # re-read under the write lock: another process may have created or upgraded it meanwhile
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version == SCHEMA_VERSION:
                return
            tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            legacy = "runs" in tables
            if legacy:
                log.info("%s: upgrading the fleet database to layout %d", self.path, SCHEMA_VERSION)
                db.execute("DROP INDEX IF EXISTS events_by_type")
                for t in ("runs", "events", "host_history"):
                    if t in tables:
                        db.execute(f"ALTER TABLE {t} RENAME TO {t}_v1")
            for stmt in _SCHEMA:
                db.execute(stmt)
            if legacy:
                self._copy_legacy(db, tables)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @staticmethod
    def _copy_legacy(db: sqlite3.Connection, tables: set[str]) -> None:
        """Carry the first layout's rows over under ``legacy:<folder name>`` keys (its runs were keyed by
        folder name, so runs that shared one are already merged there; re-indexing the folder replaces them)."""
        db.execute(
            "INSERT OR IGNORE INTO runs (uid, run_id, name, path, started, ended, status, synthetic, indexed_at)"
            " SELECT ? || run_id, NULL, run_id, path, started, ended, status, synthetic, indexed_at FROM runs_v1",
            (LEGACY_PREFIX,))
        if "events" in tables:
            db.execute("INSERT OR IGNORE INTO events SELECT ? || run_id, writer, line, type, time, host, body"
                       " FROM events_v1", (LEGACY_PREFIX,))
        if "host_history" in tables:
            db.execute("INSERT OR IGNORE INTO host_history SELECT host, ? || run_id, time, kind, detail,"
                       " source_writer, source_line FROM host_history_v1", (LEGACY_PREFIX,))
        for t in ("runs", "events", "host_history"):
            if t in tables:
                db.execute(f"DROP TABLE {t}_v1")

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
        except sqlite3.Error as exc:
            raise self._error(exc, "write") from None
        try:
            yield self._conn
        except BaseException as exc:
            with suppress(sqlite3.Error):  # a failed write may already have rolled the transaction back
                self._conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc, "write") from None
            raise
        else:
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                with suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise self._error(exc, "commit to") from None

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        try:
            yield self._conn
        except sqlite3.Error as exc:
            raise self._error(exc, "read") from None

    def index_run(self, run: RunDir | str | os.PathLike[str]) -> int:
        """Index (or re-index) one run directory; returns how many events were new (see `index`)."""
        return self.index(run).new_events

    def index(self, run: RunDir | str | os.PathLike[str]) -> IndexResult:
        """Index (or re-index) one run directory.

        Raises `InputError` when the run cannot be read (the database is left as it was),
        `FleetDBError` when the database file is unusable and `StorageError` when it cannot be written.
        """
        rd = run if isinstance(run, RunDir) else RunDir(run)
        loaded, skipped = _usable(rd, rd.load())
        if not loaded:
            raise InputError(f"{rd.root}: the run has no usable events")
        uid, run_id = run_identity(rd, loaded)
        started = ended = None
        status = None
        synthetic = False
        for item in loaded:
            e = item.record
            if isinstance(e, RunStarted) and (started is None or e.time < started):
                started, synthetic = float(e.time), e.synthetic
            elif isinstance(e, RunEnded):
                ended, status = float(e.time), _text(e.status)
        rows = [
            (uid, _text(it.writer), it.line, it.record.TYPE, float(it.record.time), _text(it.record.host),
             json.dumps(it.record.to_dict(), separators=(",", ":")))
            for it in loaded
        ]
        history = list(_host_records(uid, loaded))
        try:
            where = rd.root.resolve()
        except (OSError, RuntimeError) as exc:
            raise InputError(f"{rd.root}: cannot resolve the path ({exc})") from None
        path = _text(str(where))
        with self._transaction() as db:
            self._refuse_other_run(db, rd, uid, rows)
            self._drop_legacy(db, path)
            db.execute(
                "INSERT INTO runs (uid, run_id, name, path, started, ended, status, synthetic, indexed_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(uid) DO UPDATE SET name=excluded.name,"
                " path=excluded.path, started=excluded.started, ended=excluded.ended, status=excluded.status,"
                " synthetic=excluded.synthetic, indexed_at=excluded.indexed_at",
                (uid, run_id, _text(where.name), path, started, ended, status, int(synthetic), time.time()),
            )
            before = db.total_changes
            db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            new = db.total_changes - before
            db.executemany("INSERT OR IGNORE INTO host_history VALUES (?, ?, ?, ?, ?, ?, ?)", history)
        log.info("indexed %s (%s): %d events, %d new", rd.root, uid, len(rows), new)
        return IndexResult(uid=uid, run_id=run_id, events=len(rows), new_events=new, skipped=skipped)

    @staticmethod
    def _refuse_other_run(db: sqlite3.Connection, rd: RunDir, uid: str, rows: list[tuple[Any, ...]]) -> None:
        """Raise `InputError` when ``uid`` is already indexed with *other* records at the same places: a
        different run that shares the key (the same run id, start time and host, as two simulated trials
        written to folders of the same name had), whose events ``INSERT OR IGNORE`` would silently drop.
        A record counts as the same when its type, time and host are (a newer trainguard may write more
        fields into the body of the same record)."""
        known = db.execute("SELECT path FROM runs WHERE uid = ?", (uid,)).fetchone()
        if known is None:
            return
        db.execute("CREATE TEMP TABLE IF NOT EXISTS incoming (writer TEXT NOT NULL, line INTEGER NOT NULL,"
                   " type TEXT NOT NULL, time REAL NOT NULL, host TEXT NOT NULL, PRIMARY KEY (writer, line))")
        db.execute("DELETE FROM incoming")
        db.executemany("INSERT OR REPLACE INTO incoming VALUES (?, ?, ?, ?, ?)",
                       [(r[1], r[2], r[3], r[4], r[5]) for r in rows])
        differ = db.execute(
            "SELECT COUNT(*) FROM incoming i JOIN events e ON e.run_uid = ? AND e.writer = i.writer"
            " AND e.line = i.line WHERE e.type != i.type OR e.time != i.time OR e.host != i.host",
            (uid,)).fetchone()[0]
        db.execute("DELETE FROM incoming")
        if differ:
            raise InputError(
                f"{rd.root}: {differ} of its records differ from those of run {uid}, already indexed from "
                f"{known[0]}: two different runs share one key (the same run id, start time and host); nothing "
                "of it was indexed. Give one of them its own run id (--rdzv-id, or a distinct folder name)")

    @staticmethod
    def _drop_legacy(db: sqlite3.Connection, path: str) -> None:
        """Remove the first layout's copy of the run at ``path``: it is being indexed properly now."""
        old = [u for (u,) in db.execute("SELECT uid FROM runs WHERE path = ? AND uid LIKE ?",
                                        (path, LEGACY_PREFIX + "%"))]
        for u in old:
            for table, key in (("events", "run_uid"), ("host_history", "run_uid"), ("runs", "uid")):
                db.execute(f"DELETE FROM {table} WHERE {key} = ?", (u,))

    def runs(self) -> list[RunRecord]:
        with self._reading() as db:
            cur = db.execute(
                "SELECT r.uid, r.run_id, r.name, r.path, r.started, r.ended, r.status, r.synthetic,"
                " (SELECT COUNT(*) FROM events e WHERE e.run_uid = r.uid)"
                " FROM runs r ORDER BY r.started, r.uid"
            )
            rows: list[Any] = cur.fetchall()
        return [RunRecord(a, b, c, d, e, f, g, bool(h), i) for a, b, c, d, e, f, g, h, i in rows]

    def event_count(self, run: str | None = None) -> int:
        """Events in the database; with ``run``, of the runs whose key (uid), run_id or folder name is
        ``run`` (ids and folder names may be shared by several runs: then all of them count)."""
        with self._reading() as db:
            if run is None:
                return int(db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
            return int(db.execute(
                "SELECT COUNT(*) FROM events WHERE run_uid IN"
                " (SELECT uid FROM runs WHERE uid = ? OR run_id = ? OR name = ?)", (run, run, run)).fetchone()[0])

    def hosts(self) -> list[str]:
        with self._reading() as db:
            cur = db.execute("SELECT DISTINCT host FROM host_history ORDER BY host")
            return [h for (h,) in cur.fetchall()]

    def drain_history(self, host: str | None = None) -> list[HostRecord]:
        """The drain policy's records (`DRAIN_KINDS`), oldest first: drained, refused, failed, returned."""
        return [r for r in self.host_history(host) if r.kind in DRAIN_KINDS]

    def link_history(self, host: str | None = None) -> list[HostRecord]:
        """Link-level records (`LINK_KINDS`), oldest first."""
        return [r for r in self.host_history(host) if r.kind in LINK_KINDS]

    def host_history(self, host: str | None = None) -> list[HostRecord]:
        sql = "SELECT host, run_uid, time, kind, detail FROM host_history"
        args: tuple[str, ...] = ()
        if host is not None:
            sql += " WHERE host = ?"
            args = (host,)
        with self._reading() as db:
            cur = db.execute(sql + " ORDER BY time, host, kind", args)
            return [HostRecord(*row) for row in cur.fetchall()]
