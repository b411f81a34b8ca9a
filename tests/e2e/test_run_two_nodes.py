"""Two node agents on this machine (2 x 2 ranks, c10d rendezvous on 127.0.0.1): crashes and a sick node."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e._run_helpers import (
    TINY,
    TRAIN_GPT,
    events,
    free_port,
    json_result,
    of_type,
    start_trainguard,
    wait_for_store,
)


def _two_agents(tmp_path: Path, nnodes: str, inject: str, steps: int, *extra: str) -> dict[str, int]:
    run_dir = tmp_path / "run"
    endpoint = f"127.0.0.1:{free_port()}"
    procs = {}
    for node in ("node0", "node1"):
        if node == "node1":
            wait_for_store(endpoint, procs["node0"])
        procs[node] = start_trainguard(
            "run", "--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-endpoint", endpoint,
            "--rdzv-id", "twonodes", "--node-id", node, "--run-dir", str(run_dir), "--json",
            "--inject", inject, *extra, "--", str(TRAIN_GPT), "--steps", str(steps), "--ckpt-every", "2", *TINY,
            log=tmp_path / f"{node}.log",
        )
    codes = {node: p.wait(timeout=150) for node, p in procs.items()}
    return codes


@pytest.mark.slow
@pytest.mark.parametrize("crash_rank", [1, 3])
def test_two_agents_survive_a_crash_on_either_node(tmp_path: Path, crash_rank: int) -> None:
    codes = _two_agents(tmp_path, "2", f"crash@step=4,rank={crash_rank}", 8)
    logs = {n: (tmp_path / f"{n}.log").read_text()[-3000:] for n in codes}
    assert codes == {"node0": 0, "node1": 0}, logs
    records = events(tmp_path / "run")
    # Ranks 0-1 run on one node and 2-3 on the other: rank 1 and rank 3 cover both nodes.
    rank_hosts = {s["rank"]: s["host"] for s in of_type(records, "step_completed")}
    assert len({rank_hosts[1], rank_hosts[3]}) == 2
    injected = of_type(records, "fault_injected")
    assert [(f["rank"], f["step"], f["host"]) for f in injected] == [(crash_rank, 4, rank_hosts[crash_rank])]
    failures = of_type(records, "failure_detected")  # recorded once, by the node that lost the rank
    assert [(f["kind"], f["ranks"], f["host"], f["hosts"]) for f in failures] == [
        ("crash", [crash_rank], rank_hosts[crash_rank], [rank_hosts[crash_rank]])]
    for node in codes:
        assert json_result(tmp_path / f"{node}.log")["completed_steps"] == 8
    ended = of_type(records, "run_ended")
    assert len(ended) == 1 and ended[0]["status"] == "completed"
    steps = {(s["rank"], s["step"]) for s in of_type(records, "step_completed")}
    assert steps >= {(r, n) for r in range(4) for n in range(1, 9)}
    started = of_type(records, "attempt_started")
    assert sorted((a["host"], a["attempt"]) for a in started) == [
        ("node0", 0), ("node0", 1), ("node1", 0), ("node1", 1)]


@pytest.mark.slow
def test_an_unhealthy_node_is_excluded_before_the_restart_and_the_job_finishes_without_it(tmp_path: Path) -> None:
    # node1 starts once node0's store is up; the last call must outlast its start-up (imports, health checks) on
    # a loaded machine, or node0 forms attempt 0 alone. It costs its length once more at attempt 1, without node1.
    codes = _two_agents(tmp_path, "1:2", "crash@step=4,rank=0;unhealthy@node=node1,attempt=1", 10,
                        "--rdzv-last-call", "20")
    logs = {n: (tmp_path / f"{n}.log").read_text()[-3000:] for n in codes}
    assert codes == {"node0": 0, "node1": 5}, logs
    assert json_result(tmp_path / "node1.log")["status"] == "excluded"
    records = events(tmp_path / "run")
    excluded = of_type(records, "node_excluded")
    assert [(e["node"], e["attempt"]) for e in excluded] == [("node1", 1)]
    checks = [c for c in of_type(records, "health_check") if c["host"] == "node1" and c["name"] == "injected"]
    assert [(c["attempt"], c["ok"]) for c in checks] == [(0, True), (1, False)]
    started = [a for a in of_type(records, "attempt_started") if a["host"] == "node0"]
    assert [(a["attempt"], a["world_size"]) for a in started] == [(0, 4), (1, 2)]
    assert not [a for a in of_type(records, "attempt_started") if a["host"] == "node1" and a["attempt"] == 1]
    assert json_result(tmp_path / "node0.log")["completed_steps"] == 10
    last = [s for s in of_type(records, "step_completed") if s["attempt"] == 1]
    assert {s["rank"] for s in last} == {0, 1} and max(s["step"] for s in last) == 10
