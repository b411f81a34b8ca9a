"""`trainguard.launch.lifetime.ProcessTracker`: the run's processes are found by the marker in their
environment; sweeps end those that left the agent's process tree, the end of the run ends all of them.
`die_with_parent_command`: a child that dies with its parent even while it is still importing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e._run_helpers import process_gone
from trainguard.launch.lifetime import TAG_ENV, ProcessTracker, die_with_parent_command, tagged
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


_SLOW_MODULE = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1]).write_text(str(os.getpid()))  # argv as under -m: the module's arguments
time.sleep(3600)
"""


def test_a_child_started_to_die_with_its_parent_dies_even_while_it_imports(tmp_path: Path) -> None:
    (tmp_path / "slowmod.py").write_text("import slowdep\n")
    (tmp_path / "slowdep.py").write_text(_SLOW_MODULE)  # the import never ends
    started = tmp_path / "started"
    parent = subprocess.Popen([sys.executable, "-c", f"""
import subprocess, sys, time
from trainguard.launch.lifetime import die_with_parent_command
subprocess.Popen(die_with_parent_command(sys.executable, ["-u"], "slowmod", [{str(started)!r}]), cwd={str(tmp_path)!r},
                 start_new_session=True)
time.sleep(3600)
"""])
    try:
        deadline = time.monotonic() + 60
        while not (started.exists() and started.read_text()) and time.monotonic() < deadline:
            assert parent.poll() is None
            time.sleep(0.05)
        child = int(started.read_text())  # in the middle of importing slowmod
        parent.kill()
        parent.wait()
        assert _wait_gone(child, 30), "the child outlived its parent"
    finally:
        parent.kill()


def test_a_child_whose_parent_is_already_gone_exits_without_running() -> None:
    cmd = die_with_parent_command(sys.executable, [], "this_module_does_not_exist", [])
    cmd[cmd.index("-c") + 2] = str(os.getpid() + 1)  # as if the parent died between the fork and the call
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr  # the module was never looked for
    cmd[cmd.index("-c") + 2] = str(os.getpid())
    assert "No module named this_module_does_not_exist" in subprocess.run(cmd, capture_output=True, text=True,
                                                                          timeout=60).stderr
