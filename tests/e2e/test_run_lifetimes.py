"""No process outlives its job: workers die with a killed agent, and descendants that left a worker's
session (a ``setsid`` child that ignores SIGTERM) end with their attempt and with the run; so do warm
spares, in every phase.

The breaks they reproduce: SIGKILL of ``trainguard run`` left every worker running under init, a
worker's ``setsid`` child survived every restart and the job's exit 0, and a warm spare still importing
lived on under init until its imports were done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._run_helpers import process_gone, start_trainguard
from tests.e2e._spare_phases import PHASES, kill_agent_in

pytestmark = pytest.mark.timeout(240)

DETACH = Path(__file__).resolve().parent / "userscripts" / "detach.py"


def _wait_for(paths: list[Path], proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text() for p in paths) and time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    assert all(p.exists() for p in paths), log.read_text()[-3000:]


def _pid(path: Path) -> int:
    return int(path.read_text())


def _gone_within(pids: list[int], seconds: float) -> float:
    start = time.monotonic()
    while not all(process_gone(p) for p in pids) and time.monotonic() - start < seconds:
        time.sleep(0.05)
    left = [p for p in pids if not process_gone(p)]
    for p in left:  # never leave them behind for the next test
        os.kill(p, signal.SIGKILL)
    assert not left, f"still running {seconds:g}s after the agent died: {left}"
    return time.monotonic() - start


def _end_leftovers(run_dir: Path) -> None:
    """Whatever a failed test left running for this run (found by the run directory in its environment)."""
    want = f"TRAINGUARD_RUN_DIR={run_dir.resolve()}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if want in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue


def _lifeline(agent: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if b"--lifeline" in cmd and int(stat[stat.rfind(")") + 2:].split()[1]) == agent:
                return int(entry.name)
    return None


@pytest.mark.parametrize("variant", ["auto", "no-auto-instrument", "auto-without-lifeline"])
def test_workers_and_their_detached_children_die_with_a_killed_agent(tmp_path: Path, variant: str) -> None:
    out, log = tmp_path / "out", tmp_path / "run.log"
    out.mkdir()
    extra = ["--no-auto-instrument"] if variant == "no-auto-instrument" else []
    proc = start_trainguard("run", "--standalone", "--nproc-per-node", "2", "--no-health-checks", "--run-dir",
                            str(tmp_path / "run"), *extra, str(DETACH), str(out), "forever", log=log)
    try:
        _wait_for([out / "worker-0-0", out / "worker-0-1", out / "helper-0"], proc, log)
        workers = [_pid(out / "worker-0-0"), _pid(out / "worker-0-1")]
        helper = _pid(out / "helper-0")
        if variant == "auto-without-lifeline":  # the workers' own PR_SET_PDEATHSIG, alone
            lifeline = _lifeline(proc.pid)
            assert lifeline is not None
            os.kill(lifeline, signal.SIGKILL)
            time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        _gone_within(workers, 5)
        if variant == "auto-without-lifeline":
            os.kill(helper, signal.SIGKILL)  # nothing but the lifeline reaches a process outside the tree
        else:
            _gone_within([helper], 5)
    finally:
        if proc.poll() is None:
            proc.kill()
        _end_leftovers(tmp_path / "run")


def test_a_setsid_child_that_ignores_sigterm_ends_with_its_attempt_and_with_the_run(tmp_path: Path) -> None:
    out, log = tmp_path / "out", tmp_path / "run.log"
    out.mkdir()
    proc = start_trainguard("run", "--standalone", "--nproc-per-node", "2", "--no-health-checks", "--max-restarts",
                            "1", "--run-dir", str(tmp_path / "run"), str(DETACH), str(out), "crash-then-finish",
                            log=log)
    try:
        code = proc.wait(timeout=180)
        assert code == 0, log.read_text()[-3000:]
        first, second = _pid(out / "helper-0"), _pid(out / "helper-1")
        assert (out / "seen-1").read_text() == "gone"  # attempt 0's helper did not live into attempt 1
        _gone_within([first, second], 2)  # and nothing of the run outlives it
    finally:
        if proc.poll() is None:
            proc.kill()
        _end_leftovers(tmp_path / "run")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("phase", PHASES)
def test_warm_spares_die_with_a_killed_agent_in_every_phase(tmp_path: Path, phase: str,
                                                            record_property: Callable[[str, Any], None]) -> None:
    # The goal is 2 s (benchmarks/lifetime.py measures it); the bound here only has to tell "ends with the
    # agent" from "lives on", so a busy machine cannot fail it. The measured figure goes to the report.
    killed = kill_agent_in(phase, tmp_path, bound=30.0)
    record_property("seconds_to_gone", killed.seconds)
    assert not killed.left, f"{phase}: still running 30s after the agent died: {killed.left}"
