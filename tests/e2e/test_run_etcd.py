"""The etcd-v2 rendezvous: the state lives in a real etcd server, so the death of the node that started the job
(agent and workers) does not end it; the other two of 3 agents x 2 ranks re-form and finish every step."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e._etcd import etcd_server  # noqa: F401 (a fixture)
from tests.e2e._nodes import FAST_RDZV, agents, assert_every_node_counted_once, started
from tests.e2e._run_helpers import events, of_type
from trainguard.launch.nodes import beat_path

STEPS = 12


@pytest.mark.slow
def test_with_etcd_the_node_that_started_the_job_can_die(tmp_path: Path, etcd_server: str) -> None:  # noqa: F811
    with agents(tmp_path, nnodes="2:3", nproc=2, endpoint=etcd_server, steps=STEPS,
                inject="node-crash@step=4,node=node0",
                extra=("--rdzv-backend", "etcd-v2", *FAST_RDZV)) as job:
        job.start("node0")
        job.wait("node0's agent", lambda: beat_path(job.run_dir, "node0").exists())
        job.start("node1")
        job.start("node2")
        job.wait("node1's workers", lambda: started(job.run_dir, "node1"))
        codes = job.finish()
    assert codes == {"node0": -9, "node1": 0, "node2": 0}, job.tails()
    records = events(job.run_dir)
    fired = of_type(records, "fault_injected")
    assert [(f["kind"], f["host"], f["attempt"]) for f in fired] == [("node-crash", "node0", 0)]
    first = [a for a in of_type(records, "attempt_started") if a["attempt"] == 0]
    assert sorted((a["host"], a["world_size"]) for a in first) == [("node0", 6), ("node1", 6), ("node2", 6)]

    failures = of_type(records, "failure_detected")
    assert [(f["kind"], f["hosts"], f["attempt"]) for f in failures] == [("node-lost", ["node0"], 0)], failures
    assert failures[0]["host"] in ("node1", "node2")
    assert [(e["node"], e["attempt"]) for e in of_type(records, "node_excluded")] == [("node0", 1)]

    final = [a for a in of_type(records, "attempt_started") if a["attempt"] == 1]
    assert sorted((a["host"], a["world_size"]) for a in final) == [("node1", 4), ("node2", 4)]
    assert {(s["rank"], s["step"]) for s in of_type(records, "step_completed")} >= {
        (r, n) for r in range(4) for n in range(1, STEPS + 1)}
    # The job is started and ended once, though the agent that started it died midway.
    assert len(of_type(records, "run_started")) == 1
    ended = of_type(records, "run_ended")
    assert [(e["status"], e["completed_steps"]) for e in ended] == [("completed", STEPS)]
    assert ended[0]["host"] in ("node1", "node2")
    for node in ("node1", "node2"):
        assert (job.result(node)["status"], job.result(node)["completed_steps"]) == ("completed", STEPS)
    assert {p.name for p in (job.run_dir / "events").glob("agent-*.jsonl")} == {
        "agent-node0.jsonl", "agent-node1.jsonl", "agent-node2.jsonl"}
    assert_every_node_counted_once(job.run_dir, tmp_path / "fleet.db", {"node0", "node1", "node2"})
