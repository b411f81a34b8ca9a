"""Which runs the dashboard shows, and their reports and views cached until their event files change.

Runs come from the paths given to ``trainguard serve`` (a run directory, or a folder of them, rescanned
on every listing so new runs appear) and from the fleet database, opened read-only: the dashboard never
writes, not even the database's journal settings.
"""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from trainguard.errors import InputError, TrainguardError, UsageError

log = logging.getLogger(__name__)

CACHED_RUNS = 64
"""Runs whose report and view are kept in memory (least recently used dropped first)."""
CACHED_SUMMARIES = 100_000
"""Runs whose one-line summary (a few hundred bytes) is kept: the run list never recomputes a report that
did not change, however many runs there are (with the 64 reports alone, 150 runs thrashed: 13.5 s a list)."""
MAX_EVENT_BYTES = 512 * 1024 * 1024
"""A run with more event bytes than this is not read by the dashboard (its memory and time would follow the
file: a 2 GB event file took the server to its memory cap); it is listed as too large, with the command that
reads it."""
_SAFE = re.compile(r"[^A-Za-z0-9_.@-]+")


@dataclass(frozen=True)
class RunEntry:
    """One run the dashboard can show."""

    id: str
    """URL key: the folder name, with a short hash of the path when two folders share a name."""
    path: Path
    source: str
    """``path`` (given on the command line) or ``db`` (from the fleet database)."""


def is_run_dir(path: Path) -> bool:
    return (path / "events").is_dir()


def _db_paths(db: str | Path) -> list[Path]:
    """Run folders the fleet database knows, oldest first, read without writing anything."""
    if isinstance(db, str):
        return _server_paths(db)
    path = db.resolve()
    # A read-only connection to a WAL database still creates its -wal and -shm files. Without a -wal file
    # no writer is active, so the file is read as immutable, which creates nothing; with one, reading needs
    # SQLite's shared memory like any reader.
    wal = path.with_name(path.name + "-wal").exists()
    uri = f"file:{quote(str(path))}?mode=ro" + ("" if wal else "&immutable=1")
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise InputError(f"{db}: cannot open the fleet database read-only ({exc})") from None
    try:
        rows = conn.execute("SELECT path FROM runs ORDER BY started, uid").fetchall()
    except sqlite3.Error as exc:
        raise InputError(f"{db}: not a usable fleet database ({exc})") from None
    finally:
        conn.close()
    return [Path(p) for (p,) in rows if isinstance(p, str)]


def _server_paths(url: str) -> list[Path]:
    """`_db_paths` of a fleet database on a PostgreSQL server, over a read-only session."""
    from trainguard.health.fleetdb import FleetDB

    try:
        with FleetDB(url, read_only=True) as fleet:
            return [Path(r.path) for r in fleet.runs()]
    except (InputError, UsageError):
        raise
    except TrainguardError as exc:  # cannot reach or read the server: as an unreadable file
        raise InputError(str(exc)) from None


class Catalog:
    """The runs under the given paths and in the fleet database ``db``."""

    def __init__(self, paths: Sequence[str | Path], db: str | Path | None = None) -> None:
        self.paths = [Path(p) for p in paths]
        self.db: str | Path | None = None
        """A file, or a ``postgresql://`` URL (kept as text: a path would fold its ``//``)."""
        if db is not None:
            from trainguard.health.fleetdb import resolve

            self.db = resolve(db)
        self._by_id: dict[str, RunEntry] = {}
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise `InputError` (exit 3) for a path or database that cannot be read (before serving)."""
        for p in self.paths:
            if not p.is_dir():
                raise InputError(f"{p}: no such directory (give run directories or folders of them)")
        if self.db is not None:
            if isinstance(self.db, Path) and not self.db.is_file():
                raise InputError(f"{self.db}: no such fleet database (create it with trainguard index)")
            _db_paths(self.db)

    def entries(self) -> list[RunEntry]:
        """Every run now, in a stable order: the command line's paths first, then the database's."""
        found: list[tuple[Path, str]] = []
        for p in self.paths:
            if is_run_dir(p):
                found.append((p, "path"))
            else:
                try:
                    found += [(c, "path") for c in sorted(p.iterdir()) if c.is_dir() and is_run_dir(c)]
                except OSError as exc:
                    log.warning("cannot list %s: %s", p, exc)
        if self.db is not None:
            try:
                found += [(p, "db") for p in _db_paths(self.db)]
            except TrainguardError as exc:
                log.warning("%s", exc)
        seen: set[Path] = set()
        unique: list[tuple[Path, str]] = []
        for p, source in found:
            key = p.resolve()
            if key not in seen:
                seen.add(key)
                unique.append((p, source))
        names: dict[str, int] = {}
        for p, _ in unique:
            names[self._name(p)] = names.get(self._name(p), 0) + 1
        out = []
        for p, source in unique:
            name = self._name(p)
            rid = name if names[name] == 1 else f"{name}-{hashlib.sha256(str(p.resolve()).encode()).hexdigest()[:6]}"
            out.append(RunEntry(rid, p, source))
        with self._lock:
            self._by_id = {e.id: e for e in out}
        return out

    @staticmethod
    def _name(p: Path) -> str:
        return _SAFE.sub("_", p.resolve().name).strip("._-") or "run"

    def get(self, run_id: str) -> RunEntry | None:
        with self._lock:
            entry = self._by_id.get(run_id)
        if entry is None:  # a run that appeared since the last listing
            entry = next((e for e in self.entries() if e.id == run_id), None)
        return entry


def signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a run's events change: name, size and modification time of each event file."""
    out = []
    try:
        for f in sorted((path / "events").iterdir()):
            if f.suffix == ".jsonl":
                try:
                    st = f.stat()
                except OSError:
                    continue
                out.append((f.name, st.st_size, st.st_mtime_ns))
    except OSError:
        pass
    return tuple(out)


def event_bytes(sig: tuple[tuple[str, int, int], ...]) -> int:
    """Total size of a run's event files, from its `signature`."""
    return sum(size for _, size, _ in sig)


class TooLarge(InputError):
    """The run's events are too large for the dashboard to read (`MAX_EVENT_BYTES`)."""


def etag(sig: tuple[Any, ...], kind: str) -> str:
    return '"' + hashlib.sha256(repr((kind, sig)).encode()).hexdigest()[:20] + '"'


class Cache:
    """Results of ``compute(path)`` per run and kind, kept while the run's event files are unchanged."""

    def __init__(self, size: int = CACHED_RUNS, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.size = size
        self.max_event_bytes = max_event_bytes
        """Runs above this many event bytes are refused (`TooLarge`) instead of read."""
        self._items: OrderedDict[tuple[str, Path], tuple[tuple[Any, ...], Any]] = OrderedDict()
        self._locks: dict[tuple[str, Path], threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, kind: str, path: Path, compute: Callable[[Path], Any]) -> tuple[Any, tuple[Any, ...]]:
        """(value, signature); an error of ``compute`` is cached like a value, so a broken run is read once."""
        key = (kind, path.resolve())
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one computation per run at a time; the others wait for its result
            sig = signature(path)
            with self._lock:
                hit = self._items.get(key)
                if hit is not None and hit[0] == sig:
                    self._items.move_to_end(key)
                    return hit[1], sig
            try:
                total = event_bytes(sig)
                if total > self.max_event_bytes:
                    raise TooLarge(f"{total / 2**20:.0f} MiB of events, more than the dashboard reads "
                                   f"({self.max_event_bytes / 2**20:.0f} MiB): use trainguard report {path}")
                value: Any = compute(path)
            except TrainguardError as exc:
                value = exc
            except OSError as exc:  # e.g. a run directory that became unreadable: an input problem of that run
                value = InputError(f"cannot read: {exc.strerror or exc}")
            with self._lock:
                self._items[key] = (sig, value)
                self._items.move_to_end(key)
                while len(self._items) > self.size:
                    old, _ = self._items.popitem(last=False)
                    self._locks.pop(old, None)
            return value, sig
