"""`trainguard.worker.group_sockets`: a live rank that leaves a broken gloo group while still holding it (a kept
DDP model does) ends its side, and a peer blocked reading from it fails then, not when that process exits.

The in-process restart test (`tests/e2e/test_run_heal.py`) failed so: after rank 0 died, rank 2 broke out and
re-entered, but rank 1, waiting on rank 2 in the same ring collective, never saw an error; 30 s later the agent
gave up and restarted every process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)


def _rank(rank: int, port: int, folder: str, end_writes: bool, wait_seconds: float) -> None:
    import torch
    import torch.distributed as dist

    from trainguard.worker.group_sockets import GroupSockets

    out = Path(folder)
    store = dist.TCPStore("127.0.0.1", port, 3, rank == 0)
    sockets = GroupSockets()
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3)
    sockets.formed()
    dist.all_reduce(torch.ones(2))
    if rank == 1:  # the others never join this one: it waits for them
        try:
            dist.all_reduce(torch.ones(2))
            (out / "rank1").write_text("returned")
        except RuntimeError:
            # Whether the peers had already given up waiting for this (and were exiting) when it failed.
            (out / "rank1").write_text("failed after the peers' exit" if (out / "exiting").exists()
                                       else "failed while the peers lived")
        os._exit(0)
    kept = dist.group.WORLD  # the group stays alive here, as a kept model's reducer keeps it  # noqa: F841
    if end_writes:
        assert sockets.end_writes() >= 2  # its connections to the two other ranks
    deadline = time.monotonic() + wait_seconds
    while not (out / "rank1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (out / "exiting").touch()
    os._exit(0)


def _run(tmp_path: Path, end_writes: bool, wait_seconds: float) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path), end_writes, wait_seconds)) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(200)
    assert [p.exitcode for p in procs] == [0, 0, 0]  # and the ranks that shut their side lived on
    return (tmp_path / "rank1").read_text()


def test_a_peer_blocked_on_a_rank_that_left_the_group_fails_while_it_lives(tmp_path: Path) -> None:
    assert _run(tmp_path, end_writes=True, wait_seconds=120) == "failed while the peers lived"


def test_without_it_the_peer_waits_until_the_process_exits(tmp_path: Path) -> None:
    # What the fix is for: torch's own teardown of a gloo group that is still referenced ends nothing.
    # (it can only fail once they exit, so they wait a short while)
    assert _run(tmp_path, end_writes=False, wait_seconds=3) == "failed after the peers' exit"
