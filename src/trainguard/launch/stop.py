"""Stopping workers fast and for sure: SIGCONT, then SIGTERM, a short grace, then SIGKILL.

torch's process context waits 30 s between SIGTERM and SIGKILL and never resumes a stopped process (a
SIGTERM stays pending on it until then). The agent stops its workers through `stop_processes` on every
path instead: restarts, final shutdown, and a hang verdict.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence

log = logging.getLogger(__name__)

REAP_WAIT_SECONDS = 1.0
"""How long to wait for a SIGKILLed process to be reaped (one in uninterruptible sleep may never be)."""


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the worker's process group (torch starts each worker in its own session), else the process."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(OSError):
            proc.send_signal(sig)


def _wait_all(procs: Sequence[subprocess.Popen[bytes]], deadline: float) -> list[subprocess.Popen[bytes]]:
    """Wait until every process ended or the deadline passed; return those still running."""
    alive = [p for p in procs if p.poll() is None]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if p.poll() is None]
    return alive


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], grace_seconds: float,
                   death_sig: signal.Signals = signal.SIGTERM) -> float:
    """End ``procs``: resume stopped ones, send ``death_sig``, SIGKILL what is left after ``grace_seconds``.

    Returns the seconds it took. A process that survives SIGKILL (uninterruptible sleep) is left behind
    with an error in the log after `REAP_WAIT_SECONDS`, so the agent itself never wedges.
    """
    start = time.monotonic()
    alive = [p for p in procs if p.poll() is None]
    if not alive:
        return 0.0
    for proc in alive:
        # A stopped process keeps SIGTERM pending until it runs again: resume it first so it can exit.
        _signal_group(proc, signal.SIGCONT)
        if death_sig != signal.SIGCONT:
            _signal_group(proc, death_sig)
    alive = _wait_all(alive, start + max(0.0, grace_seconds))
    for proc in alive:
        log.warning("worker pid %d still running %.1fs after %s: sending SIGKILL", proc.pid,
                    time.monotonic() - start, death_sig.name)
        _signal_group(proc, signal.SIGKILL)
    for proc in _wait_all(alive, time.monotonic() + REAP_WAIT_SECONDS):
        log.error("worker pid %d did not exit after SIGKILL (uninterruptible sleep?); abandoning it", proc.pid)
    return time.monotonic() - start
