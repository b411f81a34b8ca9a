"""The control channel on real processes: evidence while blocked in a collective, life without an agent, and
who may ask (only this user's agent process), with bounded requests and files nobody can redirect."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainguard.core.protocol import read_heartbeat
from trainguard.localize import safe_unpickle
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_dump_answers_while_the_main_thread_is_blocked_in_a_collective(tmp_path: Path) -> None:
    hb = tmp_path / "hb"
    run_dir = tmp_path / "run"
    out = tmp_path / "diag"
    procs = _spawn(tmp_path, 2, {"TRAINGUARD_AGENT": "1", "TRAINGUARD_AGENT_PID": str(os.getpid()),
                                 "TRAINGUARD_RUN_DIR": str(run_dir), "TRAINGUARD_EVIDENCE_DIR": str(out),
                                 "TRAINGUARD_HEARTBEAT_DIR": str(hb), "TRAINGUARD_FR_PREWARM": "0"}, _port())
    try:
        deadline = time.time() + 60
        beat = None
        while time.time() < deadline:  # rank 1 finished step 1 and entered step 2's collective
            beat = read_heartbeat(hb / "rank-1")
            if beat and beat.steps_done == 1 and beat.phase == "comm_wait":
                break
            time.sleep(0.2)
        assert beat and beat.phase == "comm_wait" and beat.source == "script", beat
        # The phase is set just before all_reduce is called: ask until the recorder shows it enqueued.
        status: dict[str, int] = {}
        while time.time() < deadline and status.get("last_enqueued_collective") != 2:
            reply = request(procs[1].pid, {"cmd": "dump"}, timeout_seconds=30)
            assert reply["ok"] and reply["step"] == 1 and reply["phase"] == "comm_wait"
            status = safe_unpickle((out / "fr_trace_rank_1.pkl").read_bytes())["pg_status"]["0"]
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


# --- who may ask, and what they can make the worker do ------------------------------------------------

CONTROL_ONLY = r'''
import os, sys, time
from pathlib import Path
from trainguard.worker.control import ControlThread
ControlThread(3, lambda: {"step": 7, "steps_done": 7, "phase": "step"},
              evidence_dir=Path(os.environ["TRAINGUARD_EVIDENCE_DIR"]),
              agent_pid=int(os.environ["TRAINGUARD_AGENT_PID"]))
print("ready", flush=True)
time.sleep(600)
'''

ATTACKER = r'''
import json, os, socket, sys
out = {"uid": os.getuid(), "reply": None, "error": None}
try:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect("\0trainguard-" + sys.argv[1])
        s.sendall(b'{"cmd": "ping"}\n{"cmd": "dump"}\n')
        out["reply"] = s.recv(4096).decode(errors="replace")
except OSError as exc:
    out["error"] = repr(exc)
print(json.dumps(out), flush=True)
'''


def _control_worker(tmp_path: Path, agent_pid: int) -> tuple[subprocess.Popen[str], Path]:
    evidence = tmp_path / "evidence"
    env = {**os.environ, "TRAINGUARD_EVIDENCE_DIR": str(evidence), "TRAINGUARD_AGENT_PID": str(agent_pid)}
    proc = subprocess.Popen([sys.executable, "-c", CONTROL_ONLY], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc, evidence


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_another_user_is_disconnected_unread_and_creates_nothing(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the client as another user (uid 65534)")
    proc, evidence = _control_worker(tmp_path, os.getpid())
    try:
        res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                              ATTACKER, str(proc.pid)], capture_output=True, text=True, timeout=30, check=False)
        if res.returncode != 0 or not res.stdout.strip():
            pytest.skip(f"cannot run a client as uid 65534: {res.stderr.strip()[-300:]}")
        out = json.loads(res.stdout)
        assert out["uid"] == 65534
        assert not out["reply"], out  # closed without a reply (or reset)
        assert not evidence.exists()
        assert request(proc.pid, {"cmd": "ping"}, timeout_seconds=5)["step"] == 7  # the agent still is served
    finally:
        proc.kill()
        proc.wait()


def test_same_user_but_not_the_agent_is_refused(tmp_path: Path) -> None:
    proc, evidence = _control_worker(tmp_path, agent_pid=1)  # the agent is someone else
    try:
        with pytest.raises((OSError, ValueError)):
            request(proc.pid, {"cmd": "dump"}, timeout_seconds=5)
        assert not evidence.exists()
    finally:
        proc.kill()
        proc.wait()


def test_slow_and_endless_clients_do_not_block_the_agent_nor_burn_cpu(tmp_path: Path) -> None:
    proc, _ = _control_worker(tmp_path, os.getpid())
    slow_closed_after: list[float] = []
    streamed: list[int] = []
    connected = [threading.Event(), threading.Event()]  # each client has sent its first bytes

    def slow() -> None:  # one byte, then silence: must be cut at the 2 s deadline
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(f"\0trainguard-{proc.pid}")
            t0 = time.monotonic()
            s.sendall(b"{")
            connected[0].set()
            s.settimeout(15)
            with contextlib.suppress(OSError):
                s.recv(10)
            slow_closed_after.append(time.monotonic() - t0)

    def endless() -> None:  # bytes without a newline: must be cut at 4 KiB
        sent = 0
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(f"\0trainguard-{proc.pid}")
            s.settimeout(10)
            try:
                while sent < 64 << 20:
                    sent += s.send(b"x" * 65536)
                    connected[1].set()  # streaming has begun
            except OSError:
                pass
            finally:
                connected[1].set()  # or the worker already hung up: either way it saw this client first
        streamed.append(sent)

    try:
        cpu0 = _cpu_seconds(proc.pid)
        threads = [threading.Thread(target=slow), threading.Thread(target=endless)]
        for t in threads:
            t.start()
        # both clients are connected ahead of the agent's request, so a worker serving one connection at a
        # time would make the agent wait for them
        assert all(e.wait(10) for e in connected)
        t0 = time.monotonic()
        reply = request(proc.pid, {"cmd": "dump"}, timeout_seconds=5)
        assert reply["ok"] and time.monotonic() - t0 < 1.5, reply
        assert sorted(reply["files"]) == ["stacks_rank_3.txt"]  # no torch in this process: stacks only
        for t in threads:
            t.join(20)
        assert slow_closed_after and 1.5 < slow_closed_after[0] < 5, slow_closed_after
        assert streamed and streamed[0] < 64 << 20, streamed  # the worker hung up long before
        assert _cpu_seconds(proc.pid) - cpu0 < 0.5
    finally:
        proc.kill()
        proc.wait()


def test_planted_symlinks_are_never_followed(tmp_path: Path) -> None:
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    proc, evidence = _control_worker(tmp_path, os.getpid())
    try:
        evidence.symlink_to(victim_dir)  # the evidence folder itself replaced by a link
        reply = request(proc.pid, {"cmd": "dump"}, timeout_seconds=5)
        assert not reply["ok"] and list(victim_dir.iterdir()) == []
        evidence.unlink()
        evidence.mkdir()
        victim = tmp_path / "victim" / "file"
        (evidence / "stacks_rank_3.txt").symlink_to(victim)  # a link where the dump goes
        reply = request(proc.pid, {"cmd": "dump"}, timeout_seconds=5)
        assert reply["ok"] and not victim.exists()
        stacks = evidence / "stacks_rank_3.txt"
        assert not stacks.is_symlink() and "trainguard-control" in stacks.read_text()
        assert sorted(p.name for p in evidence.iterdir()) == ["stacks_rank_3.txt"]  # no temp file left
    finally:
        proc.kill()
        proc.wait()
