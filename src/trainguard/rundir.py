"""The run directory: where one job's events, checkpoints, diagnostics and logs live.

    runs/<run-id>/
      events/         <writer>.jsonl, one append-only file per writer (agent-<host>, rank-<r>)
      checkpoints/    step-<N>/ committed checkpoints (see trainguard.checkpoint)
      diagnostics/    attempt-<k>/ flight-recorder dumps, stacks, log tails, verdict.json
      logs/           attempt-<k>/rank-<r>.log
      heartbeats/     <node>/attempt-<k>/rank-<r>: one small file per rank, rewritten in place
      chaos/          marker files of fired faults and unhealthy-<node> flags (trainguard.chaos)
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from trainguard.errors import InputError
from trainguard.eventlog import EventWriter, iter_events
from trainguard.events import Event

log = logging.getLogger(__name__)

_WRITER_NAME = re.compile(r"^[A-Za-z0-9_.@-]+$")


@dataclass(frozen=True)
class LoadedEvent:
    """A record with where it came from."""

    writer: str
    """Name of the event file without ``.jsonl``."""
    line: int
    record: Event


class RunDir:
    """Paths and event access for one run directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @property
    def run_id(self) -> str:
        return self.root.resolve().name

    @property
    def events_dir(self) -> Path:
        return self.root / "events"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def diagnostics_dir(self, attempt: int) -> Path:
        return self.root / "diagnostics" / f"attempt-{attempt}"

    def logs_dir(self, attempt: int) -> Path:
        return self.root / "logs" / f"attempt-{attempt}"

    def create(self) -> RunDir:
        """Make the directory skeleton (idempotent)."""
        for d in (self.events_dir, self.checkpoints_dir, self.root / "diagnostics", self.root / "logs"):
            d.mkdir(parents=True, exist_ok=True)
        return self

    def writer(self, name: str, *, fsync: bool = False) -> EventWriter:
        """An appending writer for ``events/<name>.jsonl``; ``name`` like ``agent-node1`` or ``rank-3``."""
        if not _WRITER_NAME.match(name):
            raise ValueError(f"bad event writer name {name!r}")
        return EventWriter(self.events_dir / f"{name}.jsonl", fsync=fsync)

    def event_files(self) -> list[Path]:
        """The event files, sorted by name. Raises `InputError` if this is not a run directory."""
        if not self.root.exists():
            raise InputError(f"{self.root}: no such run directory")
        if not self.root.is_dir():
            raise InputError(f"{self.root}: not a directory")
        if not self.events_dir.is_dir():
            raise InputError(f"{self.root}: not a run directory (no events/ folder)")
        return sorted(self.events_dir.glob("*.jsonl"))

    def load(self) -> list[LoadedEvent]:
        """Every record of every writer, file by file in file order. Raises `InputError` when empty."""
        out: list[LoadedEvent] = []
        for path in self.event_files():
            writer = path.name[: -len(".jsonl")]
            out.extend(LoadedEvent(writer, line, record) for line, record in iter_events(path))
        if not out:
            raise InputError(f"{self.root}: the run has no events")
        return out

    def events(self) -> list[Event]:
        """Every record, unordered across writers (use `trainguard.clocks` to order them)."""
        return [e.record for e in self.load()]
