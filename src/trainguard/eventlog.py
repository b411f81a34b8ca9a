"""Event files: an append-only JSON Lines writer (one file per writer) and a careful reader.

The writer appends each record with a single ``os.write`` on an ``O_APPEND`` descriptor, so a record
reaches the OS the moment it is written and a killed writer leaves at most one torn last line. The
reader tolerates exactly that torn last line (with a warning) and rejects anything else that is
malformed, naming the file and line.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from trainguard.errors import EventFormatError, InputError, SchemaVersionError, StorageError
from trainguard.events import SCHEMA_VERSION, Event, from_dict

log = logging.getLogger(__name__)


def _finite(value: object) -> object:
    """NaN/Infinity are not JSON: store them as null rather than write a file others cannot parse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _encode(record: Event) -> bytes:
    data = _finite(record.to_dict())
    return (json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n").encode()


class EventWriter:
    """Appends records to one JSON Lines file. Thread-safe; one writer per file by convention."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageError(f"cannot open event file {self.path}: {exc.strerror}") from None

    def write(self, record: Event) -> None:
        """Append one record; it is in the OS page cache (or on disk with ``fsync``) on return."""
        line = _encode(record)
        with self._lock:
            if self._fd is None:
                raise StorageError(f"event file {self.path} is closed")
            try:
                written = os.write(self._fd, line)
                if written != len(line):  # short write: the disk filled mid-record
                    raise OSError(errno.ENOSPC, "short write")
                if self._fsync:
                    os.fsync(self._fd)
            except OSError as exc:
                raise StorageError(f"cannot write event to {self.path}: {exc.strerror}") from None

    def write_all(self, records: Iterable[Event]) -> None:
        for record in records:
            self.write(record)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_events(path: str | os.PathLike[str]) -> Iterator[tuple[int, Event]]:
    """Yield ``(line_number, record)`` from one event file.

    A last line without its newline that does not parse is a writer killed mid-record: it is
    skipped with a warning. Any other bad line raises `EventFormatError`; a newer schema version
    raises `SchemaVersionError`.
    """
    p = Path(path)
    try:
        fh = p.open("rb")
    except FileNotFoundError:
        raise InputError(f"{p}: no such event file") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror}") from None
    with fh:
        line_no = 0
        for raw in fh:
            line_no += 1
            complete = raw.endswith(b"\n")
            text = raw.strip()
            if not text:
                continue
            try:
                data = json.loads(text)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                if not complete:
                    log.warning("%s:%d: ignoring torn last record (writer stopped mid-write)", p, line_no)
                    return
                raise EventFormatError(str(p), line_no, f"not valid JSON ({exc.__class__.__name__})") from None
            if not isinstance(data, dict):
                raise EventFormatError(str(p), line_no, "a record must be a JSON object")
            version = data.get("v")
            if not isinstance(version, int) or isinstance(version, bool):
                raise EventFormatError(str(p), line_no, "missing or invalid schema version 'v'")
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(str(p), line_no, version, SCHEMA_VERSION)
            try:
                yield line_no, from_dict(data)
            except ValueError as exc:
                raise EventFormatError(str(p), line_no, str(exc)) from None


def read_events(path: str | os.PathLike[str]) -> list[Event]:
    """All records of one event file, in file order."""
    return [record for _, record in iter_events(path)]
