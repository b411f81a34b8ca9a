"""The framework's own checkpoints, as the agent's no-progress rule needs them (`AttemptOutcome.framework_checkpoint`).

A framework adapter in the workers (`trainguard.worker.frameworks`) writes a ``checkpoint_save_finished`` record
with ``framework`` set for every save the framework makes (a Hugging Face ``checkpoint-N``, a Lightning
``.ckpt``), numbered by the framework's global step. `FrameworkCheckpoints` follows the local ranks' event
files and keeps the newest successful one. It reads each file once, from where it stopped, and decodes only
the lines that are such records, so a failure costs the bytes written since the last one.

The agent builds one per run and passes ``latest()`` as ``AttemptOutcome.framework_checkpoint`` after each failed
attempt. (The framework's global step itself needs nothing: with an adapter it is the heartbeat's step.)
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from trainguard.core.eventlog import parse_record
from trainguard.core.events import CheckpointSaveFinished
from trainguard.core.protocol import RunLayout
from trainguard.errors import InputError

log = logging.getLogger(__name__)

CHUNK = 4 << 20
"""Bytes read from one event file per read."""
_MARK = b'"checkpoint_save_finished"'


class FrameworkCheckpoints:
    """The newest checkpoint any framework adapter of this run's ranks reported (by global step)."""

    def __init__(self, layout: RunLayout) -> None:
        self.layout = layout
        self._offsets: dict[Path, int] = {}
        self._latest: int | None = None

    def latest(self) -> int | None:
        """The newest framework checkpoint step reported so far; None when none was."""
        try:
            for path in sorted(self.layout.events_dir.glob("rank-*.jsonl")):
                self._read(path)
        except OSError as exc:  # the policy must decide even when the events cannot be read
            log.debug("framework checkpoints: %s", exc)
        return self._latest

    def _read(self, path: Path) -> None:
        offset = self._offsets.get(path, 0)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            while True:
                data = os.pread(fd, CHUNK, offset)
                end = data.rfind(b"\n") + 1
                if end == 0:
                    if len(data) == CHUNK:
                        offset += len(data)  # one line longer than any record: skip it
                        continue
                    break
                self._scan(data[:end], path)
                offset += end
        finally:
            os.close(fd)
            self._offsets[path] = offset

    def _scan(self, data: bytes, path: Path) -> None:
        for raw in data.split(b"\n"):
            if _MARK not in raw or b'"framework":""' in raw.replace(b" ", b""):
                continue
            try:
                record = parse_record(raw, str(path), 0)
            except InputError:
                continue
            if isinstance(record, CheckpointSaveFinished) and record.framework and record.ok and (
                    self._latest is None or record.step > self._latest):
                self._latest = record.step
