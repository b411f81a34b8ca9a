"""A hot spare: three agents for a 1:2-node job; when a node is excluded, the waiting spare takes its place."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e._run_helpers import (
    TINY,
    TRAIN_GPT,
    events,
    free_port,
    json_result,
    of_type,
    start_trainguard,
    store_up,
)

STEPS = 6


def _wait(what: str, cond: Any, procs: dict[str, subprocess.Popen[bytes]], timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        dead = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        assert not dead, f"agents exited while waiting for {what}: {dead}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _nodes_waiting(endpoint: str, run_id: str, run_dir: Path) -> int:
    """Nodes that joined the c10d rendezvous but have no place in the running round (torch's wait list, or
    its redundancy list when the round is at the maximum), read from the store as torch's agents do."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    from trainguard.launch.signed_rendezvous import SignedStateBackend
    from trainguard.launch.store_auth import job_signer

    host, port = endpoint.rsplit(":", 1)
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
    found = SignedStateBackend(C10dRendezvousBackend(store, run_id), job_signer(run_dir), run_id).get_state()
    # torch's own pickled _RendezvousState, signed by the job's agents: verified before it is loaded
    if found is None:
        return 0
    state = pickle.loads(found[0])
    return len(state.wait_list) + len(getattr(state, "redundancy_list", ()))


def _agent_records(run_dir: Path, node: str) -> list[dict[str, Any]]:
    return events(run_dir, f"agent-{node}")


def _kill_worker_of_rank(run_dir: Path, rank: int, procs: dict[str, subprocess.Popen[bytes]]) -> str:
    """SIGKILL the worker process of ``rank`` (attempt 0); returns the node that ran it."""
    beat = next((run_dir / "heartbeats").glob(f"*/attempt-0/rank-{rank}"))
    node = beat.parent.parent.name
    # A waiting warm spare and the fork server name the script too; a forked rank shows its RANK in its environ.
    workers = [c for c in psutil.Process(procs[node].pid).children(recursive=True)
               if any(str(TRAIN_GPT) in part for part in c.cmdline()) and c.environ().get("RANK") == str(rank)]
    assert len(workers) == 1, workers
    os.kill(workers[0].pid, signal.SIGKILL)
    return node


@pytest.mark.slow
def test_a_waiting_spare_replaces_an_excluded_node_and_the_job_completes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    endpoint = f"127.0.0.1:{free_port()}"
    # Rank 0 parks the job at step 3 (a hang the watchdog would only call after 60 s), so the spare is
    # surely waiting before the failure; the test then kills that rank. At the restart (attempt 1)
    # node1 fails its injected health check and leaves; node2, the spare, takes its place.
    inject = "hang@step=3,rank=0,attempt=0;unhealthy@node=node1,attempt=1"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    # --rdzv-last-call 20: node1 must make the first round. With 3 s, a loaded host started node1's agent too
    # late, node0 formed a round alone, node1's arrival restarted it as attempt 1, and the attempt-0 hang
    # never fired (both agents completed: the test failed twice so). A round at the maximum closes at once.

    def start(node: str) -> None:
        procs[node] = start_trainguard(
            "run", "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-endpoint", endpoint,
            "--rdzv-id", "spares", "--node-id", node, "--run-dir", str(run_dir), "--json",
            "--inject", inject, "--hang-floor", "60", "--rdzv-last-call", "20",
            "--", str(TRAIN_GPT), "--steps", str(STEPS), "--ckpt-every", "2", *TINY,
            log=tmp_path / f"{node}.log",
        )

    try:
        start("node0")
        _wait("node0's rendezvous store", lambda: store_up(endpoint), procs)
        start("node1")
        # The first round is node0 + node1 (the maximum): the job runs until rank 0 parks at step 3.
        _wait("rank 0 to reach the hang", lambda: any((run_dir / "chaos").glob("fired-*")), procs)
        start("node2")
        _wait("the spare's health checks",
              lambda: any(r["type"] == "health_check" for r in _agent_records(run_dir, "node2")), procs)
        _wait("the spare to wait in the rendezvous", lambda: _nodes_waiting(endpoint, "spares", run_dir) > 0, procs)
        assert not of_type(_agent_records(run_dir, "node2"), "attempt_started")  # no room for it yet
        _kill_worker_of_rank(run_dir, 0, procs)
        codes = {node: p.wait(timeout=90) for node, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in procs}
    assert codes == {"node0": 0, "node1": 5, "node2": 0}, {n: t[-3000:] for n, t in logs.items()}

    records = events(run_dir)
    # The excluded node: one NodeExcluded at the restart, exit code 5, status "excluded".
    excluded = of_type(records, "node_excluded")
    assert [(e["node"], e["attempt"]) for e in excluded] == [("node1", 1)]
    assert json_result(tmp_path / "node1.log")["status"] == "excluded"
    # The spare took part in a later attempt: it started workers and its rank completed steps there.
    spare_started = [a for a in of_type(records, "attempt_started") if a["host"] == "node2"]
    assert spare_started and all(a["attempt"] >= 1 for a in spare_started)
    final = max(a["attempt"] for a in spare_started)
    assert sorted((a["host"], a["world_size"]) for a in of_type(records, "attempt_started")
                  if a["attempt"] == final) == [("node0", 2), ("node2", 2)]
    last = [s for s in of_type(records, "step_completed") if s["attempt"] == final]
    assert {s["host"] for s in last} == {"node0", "node2"}
    assert max(s["step"] for s in last if s["host"] == "node2") == STEPS
    assert not [s for s in of_type(records, "step_completed") if s["host"] == "node1" and s["attempt"] >= 1]
    # The job completed every step, once, as recorded by the leader and by both surviving agents.
    ended = of_type(records, "run_ended")
    assert [(e["status"], e["completed_steps"]) for e in ended] == [("completed", STEPS)]
    for node in ("node0", "node2"):
        out = json_result(tmp_path / f"{node}.log")
        assert (out["status"], out["completed_steps"]) == ("completed", STEPS), out
        assert "Traceback" not in logs[node], logs[node][-3000:]
    steps = {(s["rank"], s["step"]) for s in of_type(records, "step_completed")}
    assert steps >= {(r, n) for r in (0, 1) for n in range(1, STEPS + 1)}
