"""Event files: an append-only JSON Lines writer (one file per writer) and a careful reader.

The writer appends each record with one ``os.write`` on an ``O_APPEND`` descriptor and never leaves a
torn record in front of a good one. The reader skips what it cannot use (a torn or garbage record, an
over-long line, a file that is not a regular file) with a warning, and refuses only files written in
a newer schema version. docs/events.md states the rules.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from trainguard.core.event_decoding import from_dict
from trainguard.core.events import SCHEMA_VERSION, Event
from trainguard.errors import EventFormatError, InputError, SchemaVersionError, StorageError

log = logging.getLogger(__name__)

MAX_RECORD_BYTES = 1 << 20
"""Longest record line a reader accepts (1 MiB, newline excluded); longer lines are skipped unread."""
EVENT_FILE_MODE = 0o640
"""Mode of a new event file, whatever the umask: owner read/write, group read, others nothing."""
_WARNINGS_PER_FILE = 10
"""Skipped records logged one by one per file when nobody collects them; the rest are summed up."""


# --- writing -------------------------------------------------------------------------------------


def finite_json(value: object) -> object:
    """NaN/Infinity are not JSON: store them as null rather than write a file others cannot parse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def _encode(record: Event) -> bytes:
    data = finite_json(record.to_dict())
    return (json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n").encode()


def _open_for_append(path: Path) -> int:
    """Open (creating with `EVENT_FILE_MODE`) for appending; read access lets us inspect the tail."""
    flags = os.O_APPEND | os.O_CLOEXEC
    for _ in range(2):  # a file removed between the two opens is simply created on the second try
        try:
            fd = os.open(path, flags | os.O_RDWR | os.O_CREAT | os.O_EXCL, EVENT_FILE_MODE)
        except FileExistsError:
            pass
        else:
            os.fchmod(fd, EVENT_FILE_MODE)  # the umask only narrows os.open's mode; set it exactly
            return fd
        try:
            return os.open(path, flags | os.O_RDWR)
        except PermissionError:
            return os.open(path, flags | os.O_WRONLY)  # append-only access: fine, the tail check is moot
        except FileNotFoundError:
            continue
    raise FileNotFoundError(2, "event file vanished while opening", str(path))


class EventWriter:
    """Appends records to one JSON Lines file. Thread-safe; one writer per file by convention.

    A write that fails part-way (full disk, file size limit) is undone by truncating the file back to
    its length before the write; if even that fails, the next record starts on a new line, so the
    fragment stays a line of its own that readers skip and no good record is lost to it.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self._fsync = fsync
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = _open_for_append(self.path)
        except OSError as exc:
            raise StorageError(f"cannot open event file {self.path}: {exc.strerror}") from None
        # A writer killed mid-record (an earlier run of this process) left a fragment without its
        # newline: our first record must not be glued onto it.
        self._need_newline = not self._ends_with_newline(self._fd)

    @staticmethod
    def _ends_with_newline(fd: int) -> bool:
        try:
            size = os.fstat(fd).st_size
            return size == 0 or os.pread(fd, 1, size - 1) == b"\n"
        except OSError:
            return False  # cannot tell: an extra newline costs a blank line, which readers skip

    def write(self, record: Event) -> None:
        """Append one record; it is in the OS page cache (or on disk with ``fsync``) on return."""
        line = _encode(record)
        with self._lock:
            fd = self._fd
            if fd is None:
                raise StorageError(f"event file {self.path} is closed")
            data = b"\n" + line if self._need_newline else line
            try:
                good_length = os.fstat(fd).st_size
            except OSError as exc:
                raise StorageError(f"cannot write event to {self.path}: {exc.strerror}") from None
            try:
                written = os.write(fd, data)
            except OSError as exc:
                self._undo(fd, good_length)
                raise StorageError(f"cannot write event to {self.path}: {exc.strerror}") from None
            if written != len(data):  # the disk (or the file size limit) filled mid-record
                self._undo(fd, good_length)
                raise StorageError(
                    f"cannot write event to {self.path}: short write ({written} of {len(data)} bytes; "
                    "disk full or file size limit)"
                )
            self._need_newline = False
            if self._fsync:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    raise StorageError(f"cannot sync event file {self.path}: {exc.strerror}") from None

    def _undo(self, fd: int, good_length: int) -> None:
        """Cut a partial record off the end of the file; failing that, fence it off with a newline."""
        try:
            if os.fstat(fd).st_size != good_length:
                os.ftruncate(fd, good_length)
            if os.fstat(fd).st_size == good_length:
                return
        except OSError as exc:
            log.warning("%s: cannot remove a partial record (%s); the next record starts a new line",
                        self.path, exc.strerror)
        self._need_newline = True

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


# --- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SkippedRecord:
    """A record (or a whole file) a reader could not use and left out."""

    path: str
    """The event file."""
    line: int
    """Line number in the file (from 1); 0 when the whole file was skipped."""
    reason: str
    """Why, in a few words (``not valid JSON``, ``bad step_completed record: field 'step': ...``)."""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}" if self.line else f"{self.path}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "reason": self.reason}


class SkippedRecords:
    """Collects what readers skipped: the first `keep` in full and how many in all (bounded memory)."""

    def __init__(self, keep: int = 100) -> None:
        self.keep = keep
        self.items: list[SkippedRecord] = []
        self.total = 0

    def add(self, item: SkippedRecord) -> None:
        self.total += 1
        if len(self.items) < self.keep:
            self.items.append(item)

    def __len__(self) -> int:
        return self.total


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
"""One decoder for every record: ``json.loads`` with an argument builds a new one per call (a tenth of the time)."""


def parse_record(raw: bytes, path: str, line: int) -> Event:
    """One record from one line. Raises `EventFormatError` (bad record) or `SchemaVersionError`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise EventFormatError(path, line, "not valid UTF-8") from None
    try:
        data = _DECODER.decode(text)
    except RecursionError:
        raise EventFormatError(path, line, "JSON nested too deeply") from None
    except json.JSONDecodeError:
        raise EventFormatError(path, line, "not valid JSON") from None
    except ValueError as exc:  # an integer of more than 4300 digits, NaN/Infinity
        raise EventFormatError(path, line, f"not valid JSON ({str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise EventFormatError(path, line, "a record must be a JSON object")
    version = data.get("v")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise EventFormatError(path, line, "missing or invalid schema version 'v'")
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(path, line, version, SCHEMA_VERSION)
    try:
        return from_dict(data)
    except ValueError as exc:
        raise EventFormatError(path, line, str(exc)) from None


def _default_root(p: Path) -> Path:
    # runs/<id>/events/<writer>.jsonl: the run directory is two levels up.
    return p.parent.parent if p.parent.name == "events" else p.parent


def _open_regular(p: Path, root: Path | None) -> BinaryIO | str:
    """An open regular file, or the reason it is skipped. Never blocks (FIFOs), never leaves `root`."""
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise InputError(f"{p}: no such event file") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror}") from None
    target = p
    if stat.S_ISLNK(st.st_mode):
        target = Path(os.path.realpath(p))
        base = Path(os.path.realpath(root if root is not None else _default_root(p)))
        if not target.is_relative_to(base):
            return f"symbolic link to {target}, outside {base}: not followed"
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return "dangling symbolic link"
    except OSError as exc:
        raise InputError(f"{p}: cannot read: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise InputError(f"{p}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "not a file")
        return f"{kind}, not a regular file"
    return os.fdopen(fd, "rb", buffering=1 << 16)


def _discard_rest_of_line(fh: BinaryIO) -> bool:
    """Read past the end of an over-long line in chunks; False if the file ended first."""
    while True:
        chunk = fh.readline(1 << 16)
        if not chunk:
            return False
        if chunk.endswith(b"\n"):
            return True


class _SkipSink:
    """Where one file's skipped records go: the caller's collector, else a few warnings in the log."""

    def __init__(self, collector: SkippedRecords | None) -> None:
        self.collector = collector
        self.logged = 0

    def skip(self, item: SkippedRecord) -> None:
        if self.collector is not None:
            self.collector.add(item)
            log.debug("skipped %s", item)
            return
        self.logged += 1
        if self.logged <= _WARNINGS_PER_FILE:
            log.warning("%s (skipped)", item)

    def finish(self, p: Path) -> None:
        if self.logged > _WARNINGS_PER_FILE:
            log.warning("%s: %d more bad records skipped", p, self.logged - _WARNINGS_PER_FILE)


def _numbered_lines(fh: BinaryIO, p: Path) -> Iterator[tuple[int, bytes | None, bool]]:
    """``(line number, line, complete)`` per line. An over-long line comes as None, its rest discarded
    unread, with ``complete`` saying whether its end was found. A read error raises `InputError`."""
    line_no = 0
    try:
        while True:
            raw = fh.readline(MAX_RECORD_BYTES + 1)
            if not raw:
                return
            line_no += 1
            if not raw.endswith(b"\n") and len(raw) > MAX_RECORD_BYTES:
                yield line_no, None, _discard_rest_of_line(fh)
            else:
                yield line_no, raw, raw.endswith(b"\n")
    except OSError as exc:
        raise InputError(f"{p}:{line_no + 1}: cannot read: {exc.strerror}") from None


def iter_events(
    path: str | os.PathLike[str],
    *,
    skipped: SkippedRecords | None = None,
    strict: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> Iterator[tuple[int, Event]]:
    """Yield ``(line_number, record)`` from one event file, leaving out what cannot be used.

    Left out, each as a `SkippedRecord` added to ``skipped`` (or, without a collector, logged as a
    warning): a record that is not valid JSON or does not match its type's fields, a line longer than
    `MAX_RECORD_BYTES` (never read into memory whole), a torn last line (writer killed mid-record), and
    the whole file when it is not a regular file (a FIFO, a directory) or is a symbolic link leading
    outside ``root`` (default: the run directory above ``events/``). With ``strict``, a bad record or
    an unusable file raises `EventFormatError` / `InputError` instead (a torn last line is still only
    skipped). A record of a newer schema version always raises `SchemaVersionError`; a missing or
    unreadable file raises `InputError`.
    """
    p = Path(path)
    name = str(p)
    sink = _SkipSink(skipped)
    opened = _open_regular(p, Path(root) if root is not None else None)
    if isinstance(opened, str):
        if strict:
            raise InputError(f"{p}: {opened}")
        sink.skip(SkippedRecord(name, 0, opened))
        return
    with opened as fh:
        for line_no, raw, complete in _numbered_lines(fh, p):
            if raw is None:
                err = EventFormatError(name, line_no, f"record longer than {MAX_RECORD_BYTES} bytes")
                if strict and complete:
                    raise err
                sink.skip(SkippedRecord(name, line_no, err.reason))
                continue
            if not raw.strip():
                continue
            try:
                record = parse_record(raw, name, line_no)
            except EventFormatError as err:
                if not complete:  # only the last line can lack its newline: a writer stopped mid-record
                    sink.skip(SkippedRecord(name, line_no, "torn last record (writer stopped mid-write)"))
                    break
                if strict:
                    raise
                sink.skip(SkippedRecord(name, line_no, err.reason))
                continue
            yield line_no, record
    sink.finish(p)


def read_events(path: str | os.PathLike[str], *, skipped: SkippedRecords | None = None) -> list[Event]:
    """All usable records of one event file, in file order (see `iter_events` for what is skipped)."""
    return [record for _, record in iter_events(path, skipped=skipped)]


def run_event_files(root: str | os.PathLike[str]) -> list[Path]:
    """The ``events/*.jsonl`` entries of a run directory, sorted by name, not yet checked (`iter_events`
    skips those that are not regular files). Raises `InputError` if ``root`` is not a run directory."""
    r = Path(root)
    if not r.exists():
        raise InputError(f"{r}: no such run directory")
    if not r.is_dir():
        raise InputError(f"{r}: not a directory")
    events = r / "events"
    if not events.is_dir():
        raise InputError(f"{r}: not a run directory (no events/ folder)")
    try:
        names = sorted(e.name for e in os.scandir(events) if e.name.endswith(".jsonl"))
    except OSError as exc:
        raise InputError(f"{events}: cannot list: {exc.strerror}") from None
    return [events / n for n in names]


def iter_run(root: str | os.PathLike[str], *, skipped: SkippedRecords | None = None
             ) -> Iterator[tuple[str, int, Event]]:
    """Every usable record of a run directory as ``(writer, line, record)``, file by file in file order, one at
    a time (memory does not grow with the run: `trainguard.accounting.stepfold` builds on this).

    What `iter_events` leaves out goes to ``skipped``; symbolic links are followed only inside ``root``.
    Raises `InputError`, once the files are read, when nothing usable was found (naming the first skipped
    record, if any), and `SchemaVersionError` for a record of a newer schema.
    """
    collector = skipped if skipped is not None else SkippedRecords()
    found = False
    for path in run_event_files(root):
        writer = path.name[: -len(".jsonl")]
        for line, record in iter_events(path, skipped=collector, root=root):
            found = True
            yield writer, line, record
    if not found:
        if collector.total:
            first = collector.items[0]
            raise InputError(f"{root}: the run has no usable events ({collector.total} bad records skipped, "
                             f"first: {first})")
        raise InputError(f"{root}: the run has no events")
    if skipped is None and collector.total:
        log.warning("%s: %d bad records skipped (first: %s)", root, collector.total, collector.items[0])


def read_run(root: str | os.PathLike[str], *, skipped: SkippedRecords | None = None) -> list[tuple[str, int, Event]]:
    """Every usable record of a run directory as ``(writer, line, record)``, file by file in file order
    (`iter_run` as a list, with its errors)."""
    return list(iter_run(root, skipped=skipped))


_FOLLOW_CHUNK = 4 * MAX_RECORD_BYTES


class EventFollower:
    """Reads the records appended to one event file since the last call (``tail -f`` for events).

    A line still being written is left for the next call; a bad record is skipped (logged at debug
    level) so a live view never stops on one. The file need not exist yet.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._offset = 0
        self._line = 0

    def new_records(self) -> list[Event]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return []
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            data = os.pread(fd, _FOLLOW_CHUNK, self._offset)
        except OSError:
            return []
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) == _FOLLOW_CHUNK:  # one line longer than any record may be: drop it
            self._offset += len(data)
            return []
        self._offset += end
        out: list[Event] = []
        for raw in data[:end].split(b"\n")[:-1]:
            self._line += 1
            if not raw.strip():
                continue
            try:
                out.append(parse_record(raw, str(self.path), self._line))
            except InputError as exc:
                log.debug("skipping %s", exc)
        return out
