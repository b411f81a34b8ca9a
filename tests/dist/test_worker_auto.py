"""Automatic instrumentation of an unmodified DDP script (tests/dist/userscripts/ddp_tiny.py) on real gloo ranks.

The test process plays the agent: it starts the ranks with the worker environment and the bootstrap folder
on PYTHONPATH, reads their heartbeats and asks their control threads for dumps.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from trainguard.core.protocol import Heartbeat, RunLayout, WorkerEnv, read_heartbeat
from trainguard.worker.bootstrap import site_dir
from trainguard.worker.control import request

SCRIPT = Path(__file__).parent / "userscripts" / "ddp_tiny.py"
NODE = "n0"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(run_dir: Path, *, attempt: int = 0, chaos: str = "", auto: bool = True) -> dict[str, str]:
    layout = RunLayout(run_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(WorkerEnv(run_dir=run_dir, attempt=attempt, node=NODE, heartbeat_dir=layout.heartbeat_dir(NODE, attempt),
                         evidence_dir=layout.diagnostics_dir(attempt), agent_pid=os.getpid(), chaos=chaos,
                         pg_timeout_seconds=60.0, auto=auto).to_environ())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site_dir()), env.get("PYTHONPATH", "")) if p)
    env.update(OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="2000", TRAINGUARD_FR_PREWARM="0")
    return env


def _spawn(tmp_path: Path, world: int, args: list[str], **kw: object) -> list[subprocess.Popen[bytes]]:
    port = _port()
    base = _env(tmp_path / "run", **kw)  # type: ignore[arg-type]
    procs = []
    for rank in range(world):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        log = (tmp_path / f"rank-{rank}-{time.monotonic_ns()}.log").open("wb")
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), *args], env=env, cwd=tmp_path,
                                      stdout=log, stderr=subprocess.STDOUT))
    return procs


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()


def _wait(what: Callable[[], bool], timeout: float, message: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.1)
    raise AssertionError(message())


def _beat(run_dir: Path, rank: int, attempt: int = 0) -> Heartbeat | None:
    return read_heartbeat(RunLayout(run_dir).heartbeat_file(NODE, attempt, rank))


def _events(run_dir: Path, rank: int) -> list[dict[str, object]]:
    path = RunLayout(run_dir).rank_events(rank)
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _logs(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp_path.glob("*.log")))


@pytest.mark.slow
def test_unmodified_ddp_script_gets_heartbeats_events_chaos_hang_and_dumps(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    procs = _spawn(tmp_path, 2, ["--steps", "8", "--step-sleep", "0.05"], chaos="hang@step=3,rank=0")
    try:
        def stuck() -> bool:  # rank 0 hangs at the start of step 3; rank 1 waits in step 3's all-reduce
            b0, b1 = _beat(run_dir, 0), _beat(run_dir, 1)
            # (collective progress is polled about once a second: wait for a poll after the hang began)
            return bool(b0 and b1 and b0.steps_done == 2 and b1.steps_done == 2 and b1.pending_since_mono > 0
                        and b0.alive_mono > b0.progress_mono + 1.1 and b1.alive_mono > b1.progress_mono + 1.1)

        _wait(stuck, 90, lambda: f"{_beat(run_dir, 0)} {_beat(run_dir, 1)}\n{_logs(tmp_path)}")
        b0, b1 = _beat(run_dir, 0), _beat(run_dir, 1)
        assert b0 is not None and b1 is not None
        assert (b0.source, b1.source) == ("optimizer", "optimizer") and (b0.step, b1.step) == (2, 2)
        assert b1.collectives_done >= 2 and b1.pending_since_mono >= b1.progress_mono - 0.01
        assert b0.pending_since_mono == 0.0  # rank 0 never entered step 3's collectives
        time.sleep(1.5)
        later = _beat(run_dir, 0)
        assert later is not None and later.alive_mono > b0.alive_mono and later.progress_mono == b0.progress_mono

        reply = request(procs[1].pid, {"cmd": "dump"}, timeout_seconds=30)
        assert reply["ok"] and reply["step"] == 2 and reply["steps_done"] == 2, reply
        assert sorted(reply["files"]) == ["fr_trace_rank_1.pkl", "stacks_rank_1.txt"]
        diag = RunLayout(run_dir).diagnostics_dir(0)
        status = pickle.loads((diag / "fr_trace_rank_1.pkl").read_bytes())["pg_status"]["0"]
        assert status["last_enqueued_collective"] > status["last_completed_collective"]
        assert "trainguard-control" in (diag / "stacks_rank_1.txt").read_text()
        reply0 = request(procs[0].pid, {"cmd": "dump"}, timeout_seconds=30)
        assert reply0["ok"] and "chaos/faults.py" in (diag / "stacks_rank_0.txt").read_text()
        refused = request(procs[0].pid, {"cmd": "dump", "dir": str(tmp_path / "elsewhere")}, timeout_seconds=10)
        assert not refused["ok"] and not (tmp_path / "elsewhere").exists()

        ev0, ev1 = _events(run_dir, 0), _events(run_dir, 1)
        assert [e["step"] for e in ev1 if e["type"] == "step_completed"] == [1, 2]
        assert [e["step"] for e in ev0 if e["type"] == "step_completed"] == [1, 2]
        faults = [e for e in ev0 if e["type"] == "fault_injected"]
        assert [(f["kind"], f["step"]) for f in faults] == [("hang", 3)]
        assert all(e["duration_seconds"] > 0 for e in ev1 if e["type"] == "step_completed")
    finally:
        _kill(procs)


@pytest.mark.slow
def test_steps_continue_from_the_restored_optimizer_and_crash_fires_at_its_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    state = tmp_path / "state.pt"
    procs = _spawn(tmp_path, 2, ["--steps", "3", "--state", str(state)])
    try:
        assert [p.wait(timeout=120) for p in procs] == [0, 0], _logs(tmp_path)
    finally:
        _kill(procs)
    assert [e["step"] for e in _events(run_dir, 1) if e["type"] == "step_completed"] == [1, 2, 3]

    # The "restart": attempt 1 resumes from the saved optimizer (AdamW's state step is 3).
    procs = _spawn(tmp_path, 2, ["--steps", "3", "--state", str(state)], attempt=1, chaos="crash@step=5,rank=1")
    try:
        assert procs[1].wait(timeout=120) == -signal.SIGKILL, _logs(tmp_path)
    finally:
        _kill(procs)
    ev1 = [e for e in _events(run_dir, 1) if e["attempt"] == 1]
    # The restore of state.pt (it holds optimizer state) is seen too; its step is the restored optimizer's count.
    assert [(e["type"], e["step"]) for e in ev1] == [("checkpoint_loaded", 3), ("step_completed", 4),
                                                     ("fault_injected", 5)]
    assert ev1[0]["step_source"] == "optimizer" and ev1[0]["entry"] == "torch.load"
    beat = _beat(run_dir, 1, attempt=1)
    assert beat is not None and beat.step == 4 and beat.steps_done == 1 and beat.source == "optimizer"


@pytest.mark.slow
def test_auto_off_loads_nothing_and_the_script_still_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    procs = _spawn(tmp_path, 1, ["--steps", "2"], auto=False)
    try:
        assert procs[0].wait(timeout=120) == 0, _logs(tmp_path)
    finally:
        _kill(procs)
    assert not (run_dir / "heartbeats").exists() and not (run_dir / "events").exists()
