"""A script that attaches but never times its steps keeps the optimizer's steps as its progress, so its hang is
found. It once had no progress signal at all: on the old code this test's healthy job was called hung, every rank
and no culprit, when the first-step allowance ran out (120 s), before rank 1 was ever stopped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from tests.e2e._run_helpers import start_trainguard, wait_for_event, wait_until, worker_pid

SCRIPT = Path(__file__).resolve().parent / "userscripts" / "attach_without_steps.py"

pytestmark = pytest.mark.timeout(300)


def _optimizer_steps(run_dir: Path, rank: int) -> int:
    """Steps the optimizer hooks counted for ``rank`` (numbered by the attempt: SGD keeps no step count)."""
    path = run_dir / "events" / f"rank-{rank}.jsonl"
    if not path.exists():
        return 0
    count = 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:  # a line being written
            continue
        count += record.get("type") == "step_completed" and record.get("numbering") == "attempt"
    return count


def test_a_script_that_attaches_but_never_times_its_steps_has_its_hang_found(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "trainguard.log"
    proc = start_trainguard("run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "0", "--run-dir",
                            str(run_dir), "--no-health-checks", "--quiet", str(SCRIPT), log=log)
    pid = None
    try:
        wait_until("rank 1's optimizer steps", lambda: _optimizer_steps(run_dir, 1) >= 5, proc, log, 200)
        pid = worker_pid(run_dir, 1, 0)
        os.kill(pid, signal.SIGSTOP)
        failure = wait_for_event(run_dir, "failure_detected", proc, 150)
        proc.wait(timeout=150)
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # so that it can end, whatever the agent did
        if proc.poll() is None:
            proc.kill()
    assert (failure["kind"], failure["ranks"]) == ("hang", [1]), failure
    assert "stopped" in failure["detail"], failure
