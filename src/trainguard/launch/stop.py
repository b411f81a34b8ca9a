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


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (the worker's data loaders and other children included)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _wait_all(procs: Sequence[subprocess.Popen[bytes]], deadline: float,
              groups: Sequence[int] = ()) -> list[subprocess.Popen[bytes]]:
    """Wait until every process (and every process of ``groups``) ended or the deadline passed; return the
    processes still running."""
    alive = [p for p in procs if p.poll() is None]
    while (alive or any(_group_alive(g) for g in groups)) and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if p.poll() is None]
    return alive


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], grace_seconds: float,
                   death_sig: signal.Signals = signal.SIGTERM) -> float:
    """End ``procs``: resume stopped ones, send ``death_sig``, SIGKILL what is left after ``grace_seconds``.

    "What is left" includes the workers' process groups: a child of a worker (a data-loader process that
    ignores SIGTERM) must not outlive a worker that itself ended at the signal. Returns the seconds it took.
    A process that survives SIGKILL (uninterruptible sleep) is left behind with an error in the log after
    `REAP_WAIT_SECONDS`, so the agent itself never wedges.
    """
    start = time.monotonic()
    alive = [p for p in procs if p.poll() is None]
    if not alive:
        return 0.0
    groups = [p.pid for p in alive]  # torch starts each worker in its own session: group id = worker pid
    for proc in alive:
        # A stopped process keeps SIGTERM pending until it runs again: resume it first so it can exit.
        _signal_group(proc, signal.SIGCONT)
        if death_sig != signal.SIGCONT:
            _signal_group(proc, death_sig)
    alive = _wait_all(alive, start + max(0.0, grace_seconds), groups)
    for proc in alive:
        log.warning("worker pid %d still running %.1fs after %s: sending SIGKILL", proc.pid,
                    time.monotonic() - start, death_sig.name)
        _signal_group(proc, signal.SIGKILL)
    for pgid in groups:
        if _group_alive(pgid):  # the worker ended, a child of it did not
            log.warning("process group %d outlived its worker %.1fs after %s: sending SIGKILL", pgid,
                        time.monotonic() - start, death_sig.name)
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
    for proc in _wait_all(alive, time.monotonic() + REAP_WAIT_SECONDS):
        log.error("worker pid %d did not exit after SIGKILL (uninterruptible sleep?); abandoning it", proc.pid)
    return time.monotonic() - start
