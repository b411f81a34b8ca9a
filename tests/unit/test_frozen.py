"""`trainguard.launch.frozen`: what the kernel shows of real processes tells a frozen rank from a slow one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.unit.live_procs import next_tick, started
from trainguard.launch.frozen import FrozenWatch, sample


def test_a_stopped_process_is_frozen_once_still_for_the_confirmation_time_and_a_busy_one_never() -> None:
    stopped = started("import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.001)")
    busy = started("print('ready', flush=True)\nwhile True: pass")
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        while (seen := sample(stopped.pid)) is None or set(seen.states) != {"T"}:
            time.sleep(0.01)
        assert seen.still
        watch = FrozenWatch(confirm_seconds=1.0)
        pids = {0: stopped.pid, 1: busy.pid}
        assert watch.since(pids, 100.0) == {}  # first look: still since now
        next_tick(busy.pid)
        assert watch.since(pids, 100.5) == {}  # not yet still for long enough
        next_tick(busy.pid)
        assert watch.since(pids, 101.25) == {0: 1.25}  # the busy loop used CPU between every look
        # a rank left out (its heartbeat came back) starts over when it is silent again
        assert watch.since({1: busy.pid}, 101.3) == {}
        assert watch.since({0: stopped.pid}, 101.4) == {}
        # so does a rank whose process changed (a restart reused the rank)
        assert watch.since({0: busy.pid}, 102.5) == {}
        # woken up, it runs and uses CPU: no longer frozen
        os.kill(stopped.pid, signal.SIGCONT)
        watch2 = FrozenWatch(confirm_seconds=1.0)
        watch2.since({0: stopped.pid}, 200.0)
        next_tick(stopped.pid)
        assert watch2.since({0: stopped.pid}, 201.5) == {}
    finally:
        for proc in (stopped, busy):
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
    assert sample(stopped.pid) is None  # gone


def test_a_process_asleep_holding_the_gil_is_frozen_unless_one_of_its_threads_still_uses_cpu() -> None:
    # The GIL held in a C call that sleeps: no Python thread of it can run (its heartbeat thread would be silent).
    asleep = started("import ctypes\nprint('ready', flush=True)\nctypes.PyDLL(None).sleep(600)")
    # The same with a thread computing without the GIL (gloo's loop, a data loader's C code): the process is not
    # still, so its silence is left to the watchdog's timeout.
    working = started("import ctypes, hashlib, threading\nsleep = ctypes.PyDLL(None).sleep\n"
                       "threading.Thread(target=hashlib.pbkdf2_hmac, args=('sha256', b'x', b'y', 10**9), daemon=True)"
                       ".start()\nprint('ready', flush=True)\nsleep(600)")
    try:
        for proc in (asleep, working):
            while "nanosleep" not in Path(f"/proc/{proc.pid}/wchan").read_text():  # until it sleeps holding the GIL
                time.sleep(0.01)
        watch = FrozenWatch(confirm_seconds=1.0)
        pids = {0: asleep.pid, 1: working.pid}
        assert watch.since(pids, 100.0) == {}
        next_tick(working.pid)
        assert watch.since(pids, 101.0) == {0: 1.0}
    finally:
        for proc in (asleep, working):
            proc.kill()
            proc.wait()


def test_a_process_that_exited_and_was_not_yet_collected_is_not_frozen() -> None:
    # The rank's exit is the agent's to see (a crash, or the end of training); a parent slow to collect it leaves a
    # zombie that uses no CPU and runs no thread, and calling that a hang would hide the crash.
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while (seen := sample(proc.pid)) is not None and "Z" not in seen.states:
            time.sleep(0.01)
        assert seen is not None and not seen.still
        watch = FrozenWatch(confirm_seconds=1.0)
        assert watch.since({0: proc.pid}, 100.0) == {}
        assert watch.since({0: proc.pid}, 102.0) == {}
    finally:
        proc.wait()
