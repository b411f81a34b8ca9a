"""The run directory: where one job's events, checkpoints, diagnostics and logs live.

    runs/<run-id>/
      events/         <writer>.jsonl, one append-only file per writer (agent-<host>, rank-<r>)
      checkpoints/    step-<N>/ committed checkpoints (see trainguard.checkpoint)
      diagnostics/    attempt-<k>/ flight-recorder dumps, stacks, log tails, verdict.json
      logs/           attempt-<k>/rank-<r>.log
      heartbeats/     <node>/attempt-<k>/rank-<r>: one small file per rank, rewritten in place
      chaos/          marker files of fired faults and unhealthy-<node> flags (trainguard.chaos.faults)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from trainguard.core import safefs
from trainguard.core.eventlog import EventWriter, SkippedRecords, read_run, run_event_files
from trainguard.core.events import Event
from trainguard.core.names import check_name
from trainguard.errors import StorageError

log = logging.getLogger(__name__)

DIR_MODE = safefs.DIR_MODE


def make_dirs(path: str | os.PathLike[str], mode: int = DIR_MODE) -> Path:
    """`trainguard.core.safefs.make_dirs` with a `StorageError` (exit 4) naming the folder on failure."""
    target = Path(path)
    try:
        safefs.make_dirs(target, mode)
    except OSError as exc:
        raise StorageError(f"cannot create folder {exc.filename or target}: {exc.strerror or exc}") from None
    if not target.is_dir():
        raise StorageError(f"cannot create folder {target}: a file of that name exists")
    return target


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
        """Make the directory skeleton (idempotent); new folders get `DIR_MODE` (0750) whatever the umask.
        Raises `StorageError` when a folder cannot be created."""
        for d in (self.events_dir, self.checkpoints_dir, self.root / "diagnostics", self.root / "logs"):
            make_dirs(d)
        return self

    def writer(self, name: str, *, fsync: bool = False) -> EventWriter:
        """An appending writer for ``events/<name>.jsonl``; ``name`` like ``agent-node1`` or ``rank-3``.
        Raises `UsageError` for a name that is not a safe file name (see `trainguard.core.names.check_name`)."""
        check_name("event writer name", name)
        return EventWriter(self.events_dir / f"{name}.jsonl", fsync=fsync)

    def event_files(self) -> list[Path]:
        """The ``events/*.jsonl`` entries, sorted by name. Raises `InputError` if this is not a run directory.

        Entries that are not regular files (a FIFO would block a reader forever) are skipped by the
        readers with a warning, not refused here: one bad file must not make the whole run unreadable.
        """
        return run_event_files(self.root)

    def load(self, skipped: SkippedRecords | None = None) -> list[LoadedEvent]:
        """Every usable record of every writer, file by file in file order; bad records go to ``skipped``
        (or a warning). Raises `InputError` when nothing usable is left."""
        return [LoadedEvent(writer, line, record) for writer, line, record in read_run(self.root, skipped=skipped)]

    def events(self) -> list[Event]:
        """Every record, unordered across writers (use `trainguard.core.clocks` to order them)."""
        return [e.record for e in self.load()]
