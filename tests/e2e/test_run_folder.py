"""One run per run folder, and a run folder that disappears mid-run.

The breaks they reproduce: two ``trainguard run`` on one ``--run-dir`` both reported "completed" with their
events interleaved; a run whose folder was deleted mid-run exited 0 "completed" and every record was lost.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e._run_helpers import events, of_type, process_gone, start_trainguard, trainguard

pytestmark = pytest.mark.timeout(240)

# Each worker runs 40 s unless stopped; its pid goes to OUT/<rank>.
WORKER = "import os, sys, time\nopen(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(str(os.getpid()))\n" \
         "time.sleep(40)\n"


def _start(tmp_path: Path, run_dir: Path, name: str) -> subprocess.Popen[bytes]:
    out = tmp_path / f"pids-{name}"
    out.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return start_trainguard("run", "--standalone", "--nproc-per-node", "2", "--no-health-checks", "--node-id", "n0",
                            "--run-dir", str(run_dir), str(script), str(out), log=tmp_path / f"{name}.log")


def _wait_workers(tmp_path: Path, name: str, proc: subprocess.Popen[bytes]) -> list[int]:
    out = tmp_path / f"pids-{name}"
    deadline = time.monotonic() + 120
    while len([p for p in out.iterdir() if p.read_text()]) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
        time.sleep(0.1)
    return [int(p.read_text()) for p in out.iterdir()]


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_second_run_on_a_live_runs_folder_is_refused_with_the_holder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = _start(tmp_path, run_dir, "first")
    try:
        _wait_workers(tmp_path, "first", first)
        before = sorted(p.name for p in run_dir.rglob("*"))
        second = trainguard("run", "--standalone", "--nproc-per-node", "1", "--no-health-checks", "--node-id", "n0",
                            "--run-dir", str(run_dir), "--no-python", "true", timeout=120)
        assert second.returncode == 2, second.stderr
        assert f"is in use by pid {first.pid} on host" in second.stderr and "Traceback" not in second.stderr
        assert len([line for line in second.stderr.splitlines() if line.strip()]) == 1, second.stderr
        assert sorted(p.name for p in run_dir.rglob("*")) == before  # the second run wrote nothing
        assert first.poll() is None  # and the first goes on
    finally:
        _end(first)
    assert len(of_type(events(run_dir, "agent-"), "run_started")) == 1


def test_the_lock_of_a_dead_run_is_taken_over(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = _start(tmp_path, run_dir, "first")
    try:
        _wait_workers(tmp_path, "first", first)
        first.send_signal(signal.SIGKILL)  # no chance to release anything
        first.wait(timeout=10)
    finally:
        _end(first)
    res = trainguard("run", "--standalone", "--nproc-per-node", "1", "--no-health-checks", "--node-id", "n0",
                     "--run-dir", str(run_dir), "--no-python", "true", timeout=120)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_run_folder_deleted_or_replaced_mid_run_stops_the_run(tmp_path: Path, how: str) -> None:
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, run_dir, "run")
    try:
        workers = _wait_workers(tmp_path, "run", proc)
        if how == "deleted":
            shutil.rmtree(run_dir)
        else:
            run_dir.rename(tmp_path / "run.old")
            run_dir.mkdir()
        gone = time.monotonic()
        code = proc.wait(timeout=60)
        took = time.monotonic() - gone
    finally:
        _end(proc)
    out = (tmp_path / "run.log").read_text()
    assert code == 4, out[-3000:]
    assert took < 15, took
    line = [ln for ln in out.splitlines() if "summary: lost" in ln]
    assert line and f"run directory {run_dir} was {how}" in line[0], out[-3000:]
    kept = list(tmp_path.glob("run.lost-*.json"))
    assert len(kept) == 1 and str(kept[0]) in line[0]
    doc = json.loads(kept[0].read_text())
    assert doc["run_ended"]["status"] == "lost" and doc["run_ended"]["exit_code"] == 4
    assert [e["type"] for e in doc["agent_events"]][:2] == ["run_started", "attempt_started"]
    assert all(process_gone(p) for p in workers)
