"""The in-rank library on real gloo ranks: evidence while blocked in a collective, and life without an agent."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.worker import parse_heartbeat
from trainguard.worker.control import request

SCRIPT = r'''
import sys, time, torch, torch.distributed as dist
import trainguard
dist.init_process_group("gloo")
w = trainguard.attach()
rank = dist.get_rank()
for step in (1, 2):
    with w.step(step) as s:
        with s.phase("comm_wait"):
            if step == 2 and rank == 0:
                time.sleep(3600)  # rank 0 never joins the second all-reduce
            t = torch.ones(4)
            dist.all_reduce(t)
        s.loss = float(t[0])
print("done", flush=True)
'''


def _spawn(tmp_path: Path, world: int, env_extra: dict[str, str], port: int) -> list[subprocess.Popen[bytes]]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **env_extra}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_dump_answers_while_the_main_thread_is_blocked_in_a_collective(tmp_path: Path) -> None:
    hb = tmp_path / "hb"
    run_dir = tmp_path / "run"
    procs = _spawn(tmp_path, 2, {"TRAINGUARD_AGENT": "1", "TRAINGUARD_RUN_DIR": str(run_dir),
                                 "TRAINGUARD_HEARTBEAT_DIR": str(hb), "TRAINGUARD_FR_PREWARM": "0"}, _port())
    try:
        deadline = time.time() + 60
        beat = None
        while time.time() < deadline:  # rank 1 finished step 1 and entered step 2's collective
            path = hb / "rank-1"
            beat = parse_heartbeat(path.read_bytes()) if path.exists() else None
            if beat and beat["steps_done"] == 1 and beat["phase"] == "comm_wait":
                break
            time.sleep(0.2)
        assert beat and beat["phase"] == "comm_wait", beat
        time.sleep(0.5)
        out = tmp_path / "diag"
        reply = request(procs[1].pid, {"cmd": "dump", "dir": str(out)}, timeout_seconds=30)
        assert reply["ok"] and reply["step"] == 1 and reply["phase"] == "comm_wait"
        dump = pickle.loads((out / "fr_trace_rank_1.pkl").read_bytes())
        status = dump["pg_status"]["0"]
        assert status["last_enqueued_collective"] == 2 and status["last_completed_collective"] == 1
        stacks = (out / "stacks_rank_1.txt").read_text()
        assert "all_reduce" in stacks and "trainguard-control" in stacks
        assert request(procs[0].pid, {"cmd": "ping"})["step"] == 1
        steps = [json.loads(x) for x in (run_dir / "events" / "rank-1.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps] == [1] and steps[0]["type"] == "step_completed"
        assert "comm_wait" in steps[0]["phases"]
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()


@pytest.mark.slow
def test_without_an_agent_training_runs_and_writes_local_events(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.replace("if step == 2 and rank == 0", "if False"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()))
    res = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0 and "done" in res.stdout, res.stderr
    lines = (tmp_path / "trainguard-runs" / "local" / "events" / "rank-0.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    # An unwritable run directory degrades to no events; training still finishes.
    env["TRAINGUARD_RUN_DIR"] = "/proc/trainguard-cannot-write-here"
    env["MASTER_PORT"] = str(_port())
    res = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0 and "done" in res.stdout, res.stderr
