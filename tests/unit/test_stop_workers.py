"""Stopping workers: a process that ignores SIGTERM or is stopped is gone within the grace + 1 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from trainguard.launch.stop import stop_processes

IGNORE_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
               "time.sleep(60)")


def _start(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def test_sigterm_ignoring_and_stopped_workers_are_killed_after_the_grace() -> None:
    stubborn = _start(IGNORE_TERM)
    stopped = _start("import time; print('ready', flush=True); time.sleep(60)")
    polite = _start("import time; print('ready', flush=True); time.sleep(60)")
    os.kill(stopped.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    took = stop_processes([stubborn, stopped, polite], grace_seconds=1.0)
    assert time.monotonic() - t0 < 2.5 and took < 2.5
    assert stubborn.returncode == -signal.SIGKILL
    # The stopped one was resumed, so the pending SIGTERM ended it within the grace.
    assert stopped.returncode == -signal.SIGTERM and polite.returncode == -signal.SIGTERM


def test_nothing_to_stop_returns_at_once() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    assert stop_processes([done], grace_seconds=5.0) == 0.0


def test_a_workers_child_that_ignores_sigterm_is_killed_with_its_group() -> None:
    """A data-loader-like child in the worker's process group that ignores SIGTERM must not outlive the stop,
    even though the worker itself ends at the SIGTERM."""
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', " + repr(IGNORE_TERM) + "], stdout=subprocess.PIPE); "
            "c.stdout.readline(); print(c.pid, flush=True); print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    assert proc.stdout.readline().strip() == b"ready"
    took = stop_processes([proc], grace_seconds=1.0)
    assert proc.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and _running(child):
        time.sleep(0.02)
    assert not _running(child), "the SIGTERM-ignoring child survived its worker's stop"
    assert took < 2.5


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
