"""SIGTERM and SIGINT to the node agent are honoured in every phase, and the run's records are closed.

The break they reproduce: torch turns a signal into a ``SignalException`` raised wherever the agent's main
thread is, and ``SignalException`` is an ``Exception``. A signal landing inside one of the agent's guarded
phases (a straggler probe, a telemetry sample, a classification, a health check) was consumed there and the
job trained on; a signal during the first rendezvous killed the agent outright; and a stopped run wrote no
``attempt_ended``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e._run_helpers import TORCH_CLOSE_SECONDS, events, free_port, of_type, process_gone, start_trainguard

pytestmark = pytest.mark.timeout(300)

LIGHTNING = Path(__file__).resolve().parent / "unmodified" / "lightning_ddp.py"

# The agent through its API, with one guarded phase that swallows whatever it catches, as the straggler probe
# did: on its 15th call it is where the SIGTERM lands (sent by the process to itself, so the timing is exact).
_SWALLOWING_AGENT = """
import json, os, signal, sys, time
from pathlib import Path
from trainguard.launch import SupervisorConfig
from trainguard.launch.supervisor import free_port, supervise
from trainguard.stragglers import watch

calls = [0]
original = watch.AgentWatch.poll

def poll(self, *args, **kwargs):
    calls[0] += 1
    try:
        if calls[0] == 15:
            Path(sys.argv[2]).write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)
    except Exception:  # a guard that must never stop the job
        pass
    return original(self, *args, **kwargs)

watch.AgentWatch.poll = poll
cfg = SupervisorConfig(command=(sys.executable, "-c", "import time\\nfor _ in range(600): time.sleep(0.1)"),
                       run_dir=Path(sys.argv[1]), run_id="sig", node_id="node0", nproc_per_node=2,
                       rdzv_endpoint=f"127.0.0.1:{free_port()}", health_checks=False, auto_instrument=False,
                       no_python=True)
r = supervise(cfg)
print(json.dumps({"status": r.status, "exit_code": r.exit_code}))
sys.exit(r.exit_code)
"""


def _workers(run_dir: Path) -> list[int]:
    """Processes started for this run (their environment names its run directory)."""
    want = f"TRAINGUARD_RUN_DIR={run_dir.resolve()}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if want in env and not process_gone(int(entry.name)):
                out.append(int(entry.name))
    return out


def _closed(run_dir: Path, attempt: int) -> None:
    agent = events(run_dir, "agent-")
    ended = [e for e in of_type(agent, "attempt_ended") if e["attempt"] == attempt]
    assert ended and ended[0]["reason"] == "stopped", of_type(agent, "attempt_ended")
    run_ended = of_type(agent, "run_ended")
    assert run_ended and run_ended[-1]["status"] == "aborted" and run_ended[-1]["exit_code"] == 130, run_ended


def test_a_signal_swallowed_by_a_guarded_phase_still_stops_the_run(tmp_path: Path) -> None:
    run_dir, sent = tmp_path / "run", tmp_path / "sent"
    proc = subprocess.Popen([sys.executable, "-c", _SWALLOWING_AGENT, str(run_dir), str(sent)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert sent.exists(), out[-3000:]
    took = time.time() - float(sent.read_text())
    assert proc.returncode == 130, out[-3000:]
    assert took < TORCH_CLOSE_SECONDS - 5.0, took  # trainguard's stop, not torch's close (goal: benchmarks)
    _closed(run_dir, 0)
    assert _workers(run_dir) == []


def test_a_signal_during_the_first_rendezvous_ends_the_run_cleanly(tmp_path: Path) -> None:
    """Before any worker starts torch has no handler installed: SIGTERM used to kill the agent outright."""
    run_dir = tmp_path / "run"
    proc = start_trainguard("run", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "wait",
                            "--run-dir", str(run_dir), "--no-health-checks", "--no-auto-instrument", "--no-python",
                            "true", log=tmp_path / "out.log")
    deadline = time.monotonic() + 60
    while not list((run_dir / "nodes").glob("*.beat")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)  # the agent exists once it beats
    time.sleep(2)  # now waiting in the rendezvous for the second node
    assert proc.poll() is None, (tmp_path / "out.log").read_text()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
    out = (tmp_path / "out.log").read_text()
    assert code == 130, out
    assert "aborted (stopped by signal" in out, out


def _attempt_steps(run_dir: Path, attempt: int) -> int:
    try:
        return sum(1 for e in of_type(events(run_dir, "rank-0"), "step_completed") if e["attempt"] == attempt)
    except (ValueError, json.JSONDecodeError):  # a line being written
        return 0


def test_sigterm_after_a_hang_restart_of_an_unmodified_lightning_job(tmp_path: Path) -> None:
    """The reported case: an unmodified Lightning script, a hang of rank 0, the restart, then SIGTERM."""
    run_dir = tmp_path / "run"
    proc = start_trainguard("run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "3", "--run-dir",
                            str(run_dir), "--hang-floor", "3", "--no-health-checks", "--inject", "hang@step=8,rank=0",
                            str(LIGHTNING), "--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"),
                            log=tmp_path / "out.log")
    try:
        deadline = time.monotonic() + 200
        while _attempt_steps(run_dir, 1) < 5 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        assert _attempt_steps(run_dir, 1) >= 5, (tmp_path / "out.log").read_text()[-4000:]
        workers = _workers(run_dir)
        assert workers
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "out.log").read_text()
    assert code == 130, out[-4000:]
    assert took < TORCH_CLOSE_SECONDS - 5.0, took  # trainguard's stop, not torch's close (goal: benchmarks)
    _closed(run_dir, 1)
    assert all(process_gone(p) for p in workers)
