"""The learned hang timeout on a real unmodified script (plain DDP, never imports trainguard), with defaults.

A SIGSTOPped rank is found by the timeout learned from the job's own steps (its floor, not the busy allowance),
or sooner once the kernel shows it frozen (`trainguard.launch.frozen`), blamed, and its latency is counted from
the job's last progress (nobody recorded the fault); a hang injected by chaos (a rank asleep in Python, its
heartbeat thread alive) is given the busy allowance and its latency is counted from the fault's own record. No
timing goal is asserted: benchmarks/hang.py measures the latency.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.e2e._run_helpers import events, of_type, start_trainguard, wait_until, worker_pid
from tests.e2e.test_any_script import PLAIN
from trainguard.core.protocol import RunLayout, read_heartbeat
from trainguard.launch.watchdog import WatchdogConfig

pytestmark = pytest.mark.timeout(300)


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    run_dir, log = tmp_path / "run", tmp_path / "trainguard.log"
    proc = start_trainguard("run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--run-dir",
                            str(run_dir), "--no-health-checks", *extra, str(PLAIN), "--steps", "60",
                            "--ckpt-dir", str(tmp_path / "ckpt"), log=log)
    return proc, run_dir, log


def _steps_done(run_dir: Path, rank: int) -> int:
    beats = [read_heartbeat(p) for p in RunLayout(run_dir).heartbeats_root.glob(f"*/attempt-0/rank-{rank}")]
    return max((b.steps_done for b in beats if b is not None), default=0)


def _finish(proc: subprocess.Popen[bytes], log: Path) -> None:
    try:
        code = proc.wait(timeout=200)
    except Exception:
        proc.kill()
        raise
    assert code == 0, log.read_text(errors="replace")[-4000:]


def _timeout_in(detail: str) -> float:
    found = re.search(r"\(timeout ([0-9.]+)s\)", detail)
    assert found, detail
    return float(found.group(1))


def test_a_stopped_rank_is_found_by_the_learned_timeout_with_its_latency_from_the_last_progress(
        tmp_path: Path) -> None:
    # A floor below the default (4 s) lets the learned part show: the timeout then comes from the steps.
    proc, run_dir, log = _start(tmp_path, "--hang-floor", "1")
    wait_until("rank 1 at step 15", lambda: _steps_done(run_dir, 1) >= 15, proc, log, timeout=150)
    os.kill(worker_pid(run_dir, 1, 0), signal.SIGSTOP)
    _finish(proc, log)
    agent = events(run_dir, "agent-")
    [failure] = of_type(agent, "failure_detected")
    assert failure["kind"] == "hang" and failure["ranks"] == [1], failure
    # The timeout in force came from the steps (3 x the longest interval, over the 1 s floor), or, while the
    # stopped rank's heartbeat was younger than the stale rule (5 s) and it still looked busy, the busy
    # allowance: never the first-step or checkpoint allowance (120 s).
    assert 1.0 <= _timeout_in(failure["detail"]) <= WatchdogConfig().busy_allowance_seconds
    assert failure["latency_from"] == "last-progress"
    assert of_type(agent, "diagnosis")[0]["culprit_ranks"] == [1]
    console = log.read_text(errors="replace")
    assert "after the job's last progress (the fault's own time is unknown: an estimate)" in console



def test_a_stopped_rank_the_kernel_shows_frozen_is_found_without_waiting_out_the_timeout(tmp_path: Path) -> None:
    # Floor and busy allowance far above anything else: only the kernel's evidence can end this hang early.
    proc, run_dir, log = _start(tmp_path, "--hang-floor", "100", "--busy-allowance", "100")
    wait_until("rank 1 at step 15", lambda: _steps_done(run_dir, 1) >= 15, proc, log, timeout=150)
    pid = worker_pid(run_dir, 1, 0)
    os.kill(pid, signal.SIGSTOP)
    _finish(proc, log)
    agent = events(run_dir, "agent-")
    [failure] = of_type(agent, "failure_detected")
    assert failure["kind"] == "hang" and failure["ranks"] == [1], failure
    assert "the kernel shows rank(s) [1] frozen" in failure["detail"], failure
    assert _timeout_in(failure["detail"]) == 100.0  # the timeout in force was not what ended it
    assert failure["detection_latency_seconds"] < 100.0
    assert of_type(agent, "diagnosis")[0]["culprit_ranks"] == [1]

def test_a_rank_asleep_in_python_gets_the_busy_allowance_and_its_latency_from_the_injected_fault(
        tmp_path: Path) -> None:
    proc, run_dir, log = _start(tmp_path, "--inject", "hang@step=20,rank=1")
    _finish(proc, log)
    agent = events(run_dir, "agent-")
    [failure] = of_type(agent, "failure_detected")
    assert failure["kind"] == "hang" and failure["ranks"] == [1], failure
    assert "[1] at work outside any collective (given the busy allowance)" in failure["detail"], failure
    assert _timeout_in(failure["detail"]) == WatchdogConfig().busy_allowance_seconds
    [fault] = of_type(events(run_dir, "rank-1"), "fault_injected")
    assert failure["latency_from"] == "fault"
    assert failure["detection_latency_seconds"] == pytest.approx(failure["time"] - fault["time"], abs=1e-3)
    assert "after the injected fault" in log.read_text(errors="replace")
