"""Another local user floods a memory-tier holder: many idle connections, then large unauthenticated requests.

Used by tests/e2e/test_memory_attacks.py; run as ``python -m tests.e2e._holder_flood`` it prints the holder's
peak threads and resident memory for each attack (the figures in docs/security.md), for the trainguard on
``PYTHONPATH``. As root the attacker is uid 65534 (setpriv), else this user.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainguard.checkpoint.memory_client import _HOLDER_MAIN, Address, HolderClient
from trainguard.launch.store_auth import StoreSigner

NOBODY = 65534
SECRET = b"holder-flood-secret-0123456789abcdef"
IDLE_CONNECTIONS = 1500
LARGE_REQUESTS = 12
LARGE_BYTES = 64 << 20

ATTACK = r"""
import resource, socket, sys, threading
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port, mode, n, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
socks = []
def idle():
    try:
        socks.append(socket.create_connection((host, port), timeout=30))
    except OSError:
        pass
def large():
    # One line of `size` bytes with no newline and no valid header: never authenticated.
    try:
        s = socket.create_connection((host, port), timeout=30)
        socks.append(s)
        s.recv(64)
        chunk = b"x" * (1 << 20)
        for _ in range(size >> 20):
            s.sendall(chunk)
    except OSError:
        pass
workers = [threading.Thread(target=idle if mode == "idle" else large) for _ in range(n)]
for i in range(0, n, 50):  # 50 at a time: the listen backlog is not what is measured
    batch = workers[i:i + 50]
    for w in batch:
        w.start()
    for w in batch:
        w.join()
print("done", len(socks), flush=True)
sys.stdin.read()  # the connections stay open until the test closes our stdin
"""


@dataclass(frozen=True)
class Peak:
    """What the holder used at most while an attack held its connections open."""

    threads: int
    rss_mb: float
    connections: int
    """Connections the attacker had open (its side) when it finished."""


def attacker_prefix() -> list[str]:
    """How the attack runs: as uid 65534 through setpriv when we are root, else as this user."""
    if os.getuid() == 0 and shutil.which("setpriv") and Path("/usr/bin/python3").exists():
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3"]
    return [sys.executable]


@contextmanager
def holder(tmp: Path) -> Iterator[tuple[psutil.Process, HolderClient]]:
    """A holder on loopback, watching this process; stopped at the end."""
    node = tmp / "node"
    node.mkdir(mode=0o700)
    log = (tmp / "holder.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER_MAIN, "--node-dir", str(node), "--watch-pid",
                             str(os.getpid()), "--bind", "127.0.0.1", "--advertise", "127.0.0.1",
                             "--bound-bytes", str(1 << 20)], stdin=subprocess.PIPE, stderr=log)
    assert proc.stdin is not None
    proc.stdin.write(SECRET)
    proc.stdin.close()
    try:
        deadline = time.monotonic() + 60
        while not (node / "holder.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "holder did not start"
            time.sleep(0.05)
        state = json.loads((node / "holder.json").read_text())
        client = HolderClient(Address("n0", state["address"], int(state["port"])), StoreSigner(SECRET))
        yield psutil.Process(proc.pid), client
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()


def attack(target: psutil.Process, client: HolderClient, mode: str, count: int, size: int = 0,
           while_open: Callable[[], None] | None = None) -> Peak:
    """Run one attack; sample the holder until the attacker has finished, then call ``while_open`` (the
    attacker's connections still open on its side)."""
    cmd = [*attacker_prefix(), "-c", ATTACK, client.address.host, str(client.address.port), mode, str(count),
           str(size)]
    attacker = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    threads, rss, done = target.num_threads(), target.memory_info().rss, ""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(attacker.stdout.readline() if attacker.stdout else ""))
    reader.start()
    try:
        while reader.is_alive():
            threads, rss = max(threads, target.num_threads()), max(rss, target.memory_info().rss)
            time.sleep(0.02)
        for _ in range(25):  # a little longer: what the holder still does with the open connections
            threads, rss = max(threads, target.num_threads()), max(rss, target.memory_info().rss)
            time.sleep(0.02)
        done = lines[0] if lines else ""
        assert done.startswith("done"), f"attacker failed: {done!r}"
        if while_open is not None:
            while_open()
    finally:
        if attacker.stdin is not None:
            attacker.stdin.close()
        attacker.wait(timeout=60)
    return Peak(threads, round(rss / 2**20, 1), int(done.split()[1]))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, holder(Path(tmp)) as (target, client):
        start = {"threads": target.num_threads(), "rss_mb": round(target.memory_info().rss / 2**20, 1)}
        idle = attack(target, client, "idle", IDLE_CONNECTIONS)
        large = attack(target, client, "large", LARGE_REQUESTS, LARGE_BYTES)
        client.timeout = 120.0
        served = client.ping() > 0
        print(json.dumps({"trainguard": str(Path(sys.modules["trainguard"].__file__ or "").parent),
                          "attacker_uid": NOBODY if attacker_prefix()[0] == "setpriv" else os.getuid(),
                          "start": start, f"idle_{IDLE_CONNECTIONS}": idle.__dict__,
                          f"large_{LARGE_REQUESTS}x{LARGE_BYTES >> 20}MiB": large.__dict__, "served_after": served}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
