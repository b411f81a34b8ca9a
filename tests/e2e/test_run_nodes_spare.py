"""Three agents x two ranks for a 2-node job: node1 fails its health check at the restart and leaves (exit 5);
the waiting third agent takes its place and the job finishes every step."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e._nodes import agents, assert_every_node_counted_once
from tests.e2e._run_helpers import TRAIN_GPT, events, free_port, of_type, store_up

STEPS = 8


@pytest.mark.slow
def test_a_spare_replaces_a_node_that_fails_its_health_check(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    # Rank 0 parks the job at step 3 (the watchdog would call that hang only after 60 s) so the spare surely
    # waits before the failure; the test then kills that rank. At the restart node1 fails its injected check.
    with agents(tmp_path, nnodes="2:2", nproc=2, endpoint=endpoint, steps=STEPS,
                inject="hang@step=3,rank=0,attempt=0;unhealthy@node=node1,attempt=1",
                extra=("--hang-floor", "60", "--rdzv-last-call", "3")) as job:
        job.start("node0")
        job.wait("node0's rendezvous store", lambda: store_up(endpoint))
        job.start("node1")
        job.wait("rank 0 to reach the hang", lambda: any((job.run_dir / "chaos").glob("fired-*")))
        job.start("node2")
        job.wait("the spare's health checks", lambda: any(
            r["type"] == "health_check" for r in events(job.run_dir, "agent-node2")))
        time.sleep(2.0)  # the spare joins the rendezvous right after its checks; it is now waiting
        assert not of_type(events(job.run_dir, "agent-node2"), "attempt_started")  # no room for it yet
        _kill_rank(job.run_dir, 0, {n: p.pid for n, p in job.procs.items()})
        codes = job.finish()
    assert codes == {"node0": 0, "node1": 5, "node2": 0}, job.tails()
    records = events(job.run_dir)
    assert [(e["node"], e["attempt"], e["host"]) for e in of_type(records, "node_excluded")] == [
        ("node1", 1, "node1")]
    assert job.result("node1")["status"] == "excluded"
    spare = [a for a in of_type(records, "attempt_started") if a["host"] == "node2"]
    assert [a["attempt"] for a in spare] == [1]
    final = [a for a in of_type(records, "attempt_started") if a["attempt"] == 1]
    assert sorted((a["host"], a["world_size"]) for a in final) == [("node0", 4), ("node2", 4)]
    last = [s for s in of_type(records, "step_completed") if s["attempt"] == 1]
    assert {s["host"] for s in last} == {"node0", "node2"} and max(s["step"] for s in last) == STEPS
    assert {(s["rank"], s["step"]) for s in of_type(records, "step_completed")} >= {
        (r, n) for r in range(4) for n in range(1, STEPS + 1)}
    assert [(e["status"], e["completed_steps"]) for e in of_type(records, "run_ended")] == [("completed", STEPS)]
    assert not [f for f in of_type(records, "failure_detected") if f["kind"] == "node-lost"]
    assert {p.name for p in (job.run_dir / "events").glob("agent-*.jsonl")} == {
        "agent-node0.jsonl", "agent-node1.jsonl", "agent-node2.jsonl"}
    assert_every_node_counted_once(job.run_dir, tmp_path / "fleet.db", {"node0", "node1", "node2"})


def _kill_rank(run_dir: Path, rank: int, agent_pids: dict[str, int]) -> None:
    beat = next((run_dir / "heartbeats").glob(f"*/attempt-0/rank-{rank}"))
    node = beat.parent.parent.name
    workers = [c for c in psutil.Process(agent_pids[node]).children(recursive=True)
               if any(str(TRAIN_GPT) in part for part in c.cmdline())
               and "trainguard.worker.warm" not in c.cmdline()]  # a waiting warm spare names the script too
    # (the fork server does too, without a RANK; a rank forked from it shows its own RANK in its environ)
    env_rank = [w for w in workers if w.environ().get("RANK") == str(rank)]
    assert len(env_rank) == 1, workers
    os.kill(env_rank[0].pid, signal.SIGKILL)
