"""`ForkedProcess`: a rank forked by the fork server, whose exit status comes from the server's report. An exit is
seen when it happens (its pidfd), not only once the report has been read: the agent's early look at its ranks and
torch's poll right after must agree on who had ended (a report read in between once made torch's close of the
survivor look like a second crash: `test_run_two_nodes`, culprits [0, 1] for a crash of rank 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import cast

from trainguard.launch.fork_server import ForkedProcess, ForkServer


class _Server:
    """The two questions a `ForkedProcess` asks its server."""

    def __init__(self, running: bool = True) -> None:
        self.alive = running

    def running(self) -> bool:
        return self.alive

    def reading(self) -> bool:
        return self.alive


def test_an_ended_rank_is_seen_at_once_and_its_status_awaited_from_the_report() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        forked = ForkedProcess(proc.pid, ["rank"], cast(ForkServer, _Server()))
        assert forked.poll() is None  # alive: no wait
        os.kill(proc.pid, signal.SIGKILL)
        _, status = os.waitpid(proc.pid, 0)  # (our child here; the server reaps its own)
        proc.returncode = -signal.SIGKILL
        report = threading.Timer(0.3, forked._exited, args=(status,))  # the server's report, read a little later
        report.start()
        assert forked.poll() == -signal.SIGKILL  # not None: the exit was seen, and its report awaited
        report.join()
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()


def test_a_rank_whose_server_is_gone_is_reported_killed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        server = _Server()
        forked = ForkedProcess(proc.pid, ["rank"], cast(ForkServer, server))
        server.alive = False  # the server died (its ranks die with it) and said nothing more
        assert forked.poll() == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
