"""Shared output helpers for verbs: JSON on stdout, text made inert for a terminal, progress on stderr."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

from trainguard.report.inert import for_terminal


def print_json(obj: Any) -> None:
    """One JSON document on stdout (the ``--json`` contract: nothing else goes to stdout)."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
    sys.stdout.flush()


def print_text(text: str, *, file: TextIO | None = None) -> None:
    """Human-readable output that carries run data (log lines, host names, details): escape sequences in it
    cannot act on the reader's terminal (`trainguard.report.inert.for_terminal`)."""
    print(for_terminal(text), file=file if file is not None else sys.stdout)


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal (or ``force``)."""

    def __init__(self, total: int, label: str = "", *, force: bool = False) -> None:
        self.total = max(total, 1)
        self.label = label
        self.enabled = force or sys.stderr.isatty()
        self._last_draw = 0.0
        self.done = 0

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last_draw > 0.1 or self.done >= self.total):
            self._last_draw = now
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.done}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
