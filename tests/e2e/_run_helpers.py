"""Helpers for the ``trainguard run`` / ``demo`` end-to-end tests: a tiny GPT and event readers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TRAIN_GPT = ROOT / "src" / "trainguard" / "examples" / "train_gpt.py"
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "4", "--vocab", "64"]
TINY_DEMO = "d_model=32,layers=1,heads=2,seq=16,batch=4,vocab=64"
STUCK_SECONDS = 600.0
"""Bound of a wait that already fails the moment the job ends (an agent or the run exits): it only ends a test that
is stuck, never one that is slow because the machine is busy (pytest's per-test timeout usually comes first)."""


def trainguard(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a fresh interpreter, as a user would."""
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)


def start_trainguard(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    fh = log.open("wb")
    return subprocess.Popen([sys.executable, "-m", "trainguard", *args], stdout=fh, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def store_up(endpoint: str) -> bool:
    """Whether something listens on ``host:port`` (the rendezvous store an agent hosts)."""
    host, port = endpoint.rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def wait_for_store(endpoint: str, first: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Wait until the first agent opened the rendezvous store (the store lives in the agent on the endpoint host)."""
    deadline = time.time() + timeout
    while time.time() < deadline and first.poll() is None:
        if store_up(endpoint):
            return
        time.sleep(0.2)
    raise AssertionError("node0's agent never opened the rendezvous store")


def json_result(log: Path) -> dict[str, Any]:
    """The ``--json`` document a ``trainguard run`` printed at the end of its combined output."""
    text = log.read_text()
    return dict(json.loads(text[text.index("{\n"):]))


def events(run_dir: Path, prefix: str = "") -> list[dict[str, Any]]:
    """All records of the event files whose name starts with ``prefix``."""
    out: list[dict[str, Any]] = []
    for path in sorted((run_dir / "events").glob(f"{prefix}*.jsonl")):
        out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return out


def of_type(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == kind]


_SUPERVISE = """
import json, sys
from pathlib import Path
from trainguard.launch import SupervisorConfig, WatchdogConfig
from trainguard.launch.supervisor import free_port, supervise
a = json.loads(sys.argv[1])
cfg = SupervisorConfig(
    command=tuple(a["command"]), run_dir=Path(a["run_dir"]), run_id="e2e", node_id="node0",
    nproc_per_node=a["nproc"], rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=a["max_restarts"],
    watchdog=WatchdogConfig(**a["watchdog"]), health_checks=False, auto_instrument=a["auto"],
    stop_grace_seconds=a["grace"],
)
r = supervise(cfg)
print(json.dumps({"status": r.status, "exit_code": r.exit_code, "reason": r.reason, "attempts": r.attempts}))
sys.exit(r.exit_code)
"""


def start_supervisor(run_dir: Path, command: list[str], *, nproc: int, log: Path, max_restarts: int = 0,
                     watchdog: dict[str, float] | None = None, auto: bool = False,
                     grace: float = 3.0) -> subprocess.Popen[bytes]:
    """The node agent through its Python API (no CLI options involved), in a fresh interpreter."""
    args = {"command": command, "run_dir": str(run_dir), "nproc": nproc, "max_restarts": max_restarts,
            "watchdog": watchdog or {}, "auto": auto, "grace": grace}
    fh = log.open("wb")
    return subprocess.Popen([sys.executable, "-c", _SUPERVISE, json.dumps(args)], stdout=fh,
                            stderr=subprocess.STDOUT)


TORCH_CLOSE_SECONDS = 30.0
"""torch's elastic agent waits this long after its SIGTERM before a SIGKILL (and a SIGTERM stays pending on a
stopped process): workers gone well before it were stopped by trainguard's own escalation."""


def assert_stopped(pids: list[int], since_wall: float) -> float:
    """Every process in ``pids`` exits, even one that ignores SIGTERM or is SIGSTOPped, sooner than torch's own close
    would end it; returns the seconds from the wall time ``since_wall`` until all were gone. How soon (the goal is
    5 s) is the benchmarks' figure: a loaded machine may take longer, never as long as torch's close."""
    deadline = time.monotonic() + TORCH_CLOSE_SECONDS
    while not all(process_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    took = time.time() - since_wall
    assert all(process_gone(p) for p in pids) and took < TORCH_CLOSE_SECONDS - 5.0, (pids, took)
    return took


def process_gone(pid: int) -> bool:
    """Exited (or a zombie waiting to be reaped: it runs no more)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            data = fh.read()
    except OSError:
        return True
    return data[data.rfind(")") + 1:].split()[0] in ("Z", "X")


# A stand-in training script with no trainguard worker side: it writes protocol heartbeats itself.
FAKE_WORKER = '''
import os, signal, sys, time
from pathlib import Path
from trainguard.core.protocol import Heartbeat, RunLayout, WorkerEnv

env = WorkerEnv.from_environ()
rank = int(os.environ["RANK"])
out, mode = Path(sys.argv[1]), sys.argv[2]
role = dict(r.split("=") for r in sys.argv[3].split(",")).get(str(rank), "normal") if env.attempt == 0 else "done"
(out / f"pid-{env.attempt}-{rank}").write_text(str(os.getpid()))
if role == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
hb_path = RunLayout(env.run_dir).heartbeat_file(env.node, env.attempt, rank)
hb_path.parent.mkdir(parents=True, exist_ok=True)
hb = os.open(hb_path, os.O_WRONLY | os.O_CREAT, 0o644)
start = last = time.monotonic()


def beat(step, phase, dur=0.0):
    now = time.monotonic()
    os.pwrite(hb, Heartbeat(step=step, steps_done=step, progress_mono=last, duration_seconds=dur, phase=phase,
                            phase_start_mono=now, source="script").encode(), 0)


if role == "done":
    sys.exit(0)
beat(0, "init")
if mode == "crash":  # rank 0 exits with an error once every other rank is up
    if rank == 0:
        while len(list(out.glob("pid-0-*"))) < int(os.environ["WORLD_SIZE"]):
            time.sleep(0.05)
        time.sleep(0.5)
        sys.exit(3)
else:  # "hang": every rank steps to 6, then waits for ever (as in a collective nobody completes)
    for step in range(1, 7):
        time.sleep(0.2)
        end = time.monotonic()
        dur, last = end - last, end
        beat(step, "idle", dur)
if role == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
while True:
    time.sleep(1)
'''


def wait_until(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Poll ``ready`` until it holds; fail with the log's tail if the job ends first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the job ended while waiting for {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def wait_for_event(run_dir: Path, kind: str, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The first record of ``kind`` the agent writes, polled every 20 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = of_type(events(run_dir, "agent-"), kind)
        except ValueError:  # a line being written
            found = []
        if found:
            return found[0]
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise AssertionError(f"no {kind} record")


def worker_pid(run_dir: Path, rank: int, attempt: int) -> int:
    """The pid of the worker with this rank, found through its environment as an operator would."""
    want = {f"TRAINGUARD_RUN_DIR={run_dir.resolve()}".encode(), f"RANK={rank}".encode(),
            f"TRAINGUARD_ATTEMPT={attempt}".encode()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            return int(entry.name)
    raise AssertionError(f"no worker process of rank {rank} in attempt {attempt}")
