"""`trainguard.launch.lifetime.ProcessTracker`: the run's processes are found by the marker in their
environment; sweeps end those that left the agent's process tree, the end of the run ends all of them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e._run_helpers import process_gone
from trainguard.launch.lifetime import TAG_ENV, ProcessTracker, tagged
from trainguard.worker.bootstrap import die_with_agent

_DETACHED = """
import os, subprocess, sys
p = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.1)"], start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid, flush=True)
"""


def _wait_gone(pid: int, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while not process_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return process_gone(pid)


def test_sweeps_end_orphans_then_everything(tmp_path: Path) -> None:
    tracker = ProcessTracker()
    env = {**os.environ, **tracker.environ(0)}
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"], env=env)
    out = subprocess.run([sys.executable, "-c", _DETACHED], env=env, capture_output=True, text=True, check=True)
    orphan = int(out.stdout.split()[0])  # its parent exited: it left the agent's tree
    stranger = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.1)"],
                                env={**os.environ, TAG_ENV: "0123456789abcdef.0"})
    try:
        deadline = time.monotonic() + 10
        while {child.pid, orphan} - set(tagged(tracker.token)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert {child.pid, orphan} <= set(tagged(tracker.token))
        assert tracker.sweep() == [orphan]
        assert _wait_gone(orphan)
        assert child.poll() is None  # a live descendant of the agent is left alone
        assert tracker.close() == [child.pid]
        assert child.wait(timeout=5) == -9
        assert stranger.poll() is None  # another run's marker: not ours
    finally:
        for p in (child, stranger):
            p.kill()
            p.wait()
        if not process_gone(orphan):
            os.kill(orphan, 9)


def test_the_lifeline_ends_the_run_when_the_agent_dies() -> None:
    agent = subprocess.Popen([sys.executable, "-c", """
import os, subprocess, sys, time
from trainguard.launch.lifetime import ProcessTracker
t = ProcessTracker()
t.start_lifeline()
w = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.1)"],
                     env={**os.environ, **t.environ(0)}, start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(w.pid, flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        worker = int(agent.stdout.readline())
        time.sleep(0.3)
        agent.kill()
        agent.wait()
        assert _wait_gone(worker), "the agent's worker survived it"
    finally:
        agent.kill()


def test_only_a_direct_child_of_the_agent_asks_to_die_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINGUARD_AGENT_PID", str(os.getppid() + 1))
    assert die_with_agent() is False  # not the agent's child: nothing is set on the test process
    monkeypatch.setenv("TRAINGUARD_AGENT_PID", "not-a-pid")
    assert die_with_agent() is False
