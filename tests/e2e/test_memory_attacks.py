"""Another local user (uid 65534, a real second uid via setpriv) against the memory tier.

A probe found the holder buffering 64 MiB per unauthenticated connection with a thread per connection and no
timeout (1,500 idle connections: 988 threads; 12 large requests: 27 -> 770 MB), and that creating
``/dev/shm/trainguard-mem-<uid>`` first made every later memory-tier job of that user fail without a step.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._holder_flood import IDLE_CONNECTIONS, LARGE_BYTES, LARGE_REQUESTS, NOBODY, attack, holder
from tests.e2e._run_helpers import trainguard

THREAD_BOUND = 64 + 8
"""The holder's connection cap (memory_holder.MAX_CONNECTIONS) plus its own few threads."""
SCRIPT = Path(__file__).parent / "userscripts" / "memory_tier_crash.py"


def _need_second_uid() -> None:
    if shutil.which("setpriv") is None or not Path("/usr/bin/python3").exists() or os.getuid() != 0:
        pytest.fail("this test needs root, setpriv and /usr/bin/python3")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_holder_flooded_by_another_uid_stays_bounded_and_serves(tmp_path: Path) -> None:
    _need_second_uid()
    with holder(tmp_path) as (target, client):
        start_threads, start_rss = target.num_threads(), target.memory_info().rss
        served: list[float] = []

        def serve() -> None:  # the job's own request, while the attacker's connections are still open
            began = time.monotonic()
            assert client.ping() == target.pid and client.replicas() == {}
            served.append(time.monotonic() - began)

        idle = attack(target, client, "idle", IDLE_CONNECTIONS, while_open=serve)
        assert idle.connections == IDLE_CONNECTIONS
        # A thread per connection, but no more than the cap (plus the holder's own few).
        assert idle.threads <= THREAD_BOUND, idle
        assert served and served[0] < 60, served  # busy until idle peers were dropped, then served

        # Idle peers are dropped: the holder's threads come back down with the attacker still connected.
        deadline = time.monotonic() + 60
        while target.num_threads() > start_threads + 1:
            assert time.monotonic() < deadline, f"idle connections still held: {target.num_threads()} threads"
            time.sleep(0.1)

        large = attack(target, client, "large", LARGE_REQUESTS, LARGE_BYTES, while_open=serve)
        assert large.connections == LARGE_REQUESTS
        # An unauthenticated request costs a header's bytes, not its body: well under one request's 64 MiB.
        assert large.rss_mb * 2**20 - start_rss < 32 * 2**20, (large, start_rss)
        assert len(served) == 2


@pytest.fixture
def open_shm() -> Iterator[Path]:
    """A folder like /dev/shm (world-writable, sticky) that only this test uses."""
    root = Path(tempfile.mkdtemp(prefix="tg-open-shm-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    root.chmod(0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_memory_folder_planted_by_another_uid_does_not_stop_the_job(tmp_path: Path, open_shm: Path) -> None:
    _need_second_uid()
    planted = open_shm / f"trainguard-mem-{os.getuid()}"
    made = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "mkdir", "-m",
                           "0777", str(planted)], capture_output=True, text=True, timeout=30, cwd="/")
    assert made.returncode == 0 and os.lstat(planted).st_uid == NOBODY, made.stderr
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    res = trainguard("run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--run-dir",
                     str(run_dir), str(SCRIPT), timeout=300,
                     env={"OUT": str(out), "SHM": str(open_shm), "CKPT": str(tmp_path / "ckpt"),
                          "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        records = [json.loads(line) for line in (out / f"rank-{rank}.jsonl").read_text().splitlines()]
        # The crash's restart resumed from memory (step 6), not from storage (step 4): the tier worked.
        assert records[1] == {"attempt": 1, "start": 6, "tier": "own", "storage_bytes": 0}, records
    # The job used a private folder of its own, recorded in the folder that holds its secret (the run folder,
    # or as here, with a Checkpointer not bound to trainguard's worker, the checkpoint folder), and left the
    # planted one alone.
    pointers = [p for p in (*run_dir.glob(".memory-dir.node-*"), *(tmp_path / "ckpt").glob(".memory-dir.node-*"))
                if not p.name.endswith(".lock")]
    assert len(pointers) == 1, pointers
    assert stat.S_IMODE(pointers[0].lstat().st_mode) == 0o600
    private = Path(pointers[0].read_text())
    assert private.parent == open_shm and private.name.startswith(f"trainguard-mem-{os.getuid()}-"), private
    deadline = time.monotonic() + 60  # the holder sees the launcher end, then removes the job's memory
    while private.exists():
        assert time.monotonic() < deadline, f"{private} outlived the job"
        time.sleep(0.1)
    assert os.lstat(planted).st_uid == NOBODY and not list(planted.iterdir())
