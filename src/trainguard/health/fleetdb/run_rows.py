"""What one run directory puts into the fleet database: its key, its event rows and per-host history rows.

Pure: reads the run's records (`trainguard.core.rundir`) and derives rows, whatever database they go to. A run
is known by its content, never its folder name (`run_identity`); a record whose fields the index reads have the
wrong type costs that record only (`usable`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterator
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
from trainguard.errors import InputError

log = logging.getLogger(__name__)

_DRAIN_STATUS_KINDS = {"drained": "drained", "refused": "drain_refused", "failed": "drain_failed"}


def _text(value: str) -> str:
    """``value`` as text every backend stores alike: lone surrogates (undecodable file names, ``"\\ud800"`` in
    JSON) cannot be encoded to UTF-8 and PostgreSQL text cannot hold NUL, so both are written as escapes."""
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
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




@dataclass(frozen=True)
class RunRows:
    """Everything indexing one run writes, derived before any database is touched."""

    uid: str
    """The run's key (`run_identity`)."""
    run_id: str | None
    name: str
    """Folder name (a label)."""
    path: str
    """Absolute path of the folder."""
    started: float | None
    ended: float | None
    status: str | None
    synthetic: bool
    events: list[tuple[Any, ...]]
    """``(run_uid, writer, line, type, time, host, body)`` rows."""
    history: list[tuple[str, str, float, str, str, str, int]]
    """``(host, run_uid, time, kind, detail, source_writer, source_line)`` rows."""
    skipped: int
    """Records left out (wrong-typed fields)."""


def read_run(rd: RunDir) -> RunRows:
    """The rows of run directory ``rd``; `InputError` when it cannot be read or has no usable record."""
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
    try:
        where: Path = rd.root.resolve()
    except (OSError, RuntimeError) as exc:
        raise InputError(f"{rd.root}: cannot resolve the path ({exc})") from None
    return RunRows(uid=uid, run_id=run_id, name=_text(where.name), path=_text(str(where)), started=started,
                   ended=ended, status=status, synthetic=synthetic, events=rows,
                   history=list(_host_records(uid, loaded)), skipped=skipped)
