"""Real Python processes for the tests that read what the kernel shows of a process (`trainguard.launch.frozen`)."""

from __future__ import annotations

import subprocess
import sys
import time

from trainguard.launch.frozen import sample


def started(code: str) -> subprocess.Popen[str]:
    """A Python process running ``code`` once it printed "ready" (its start-up's CPU use is over)."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def next_tick(pid: int, *, main_thread: bool = False) -> None:
    """Wait until the process ``pid`` (its main thread alone with ``main_thread``) used one more clock tick of CPU."""
    def ticks() -> int | None:
        seen = sample(pid)
        return None if seen is None else seen.main_ticks if main_thread else seen.ticks
    first = ticks()
    assert first is not None
    while ticks() == first:
        time.sleep(0.005)
