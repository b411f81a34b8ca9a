"""`trainguard demo` on several local nodes, and its refusals. The single-node demo through its default crash and
hang, ending where a fault-free run ends, runs from the installed wheel: tests/e2e/test_installed_product.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e._run_helpers import TINY_DEMO, events, of_type, trainguard


@pytest.mark.slow
def test_demo_on_three_local_nodes_survives_a_rank_crash_and_a_node_crash(tmp_path: Path) -> None:
    res = trainguard("demo", "--nodes", "3", "--ranks-per-node", "2", "--steps", "16", "--ckpt-every", "2",
                     "--model", TINY_DEMO, "--run-dir", str(tmp_path / "run"), "--json", timeout=400)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout)
    # The default schedule with several nodes: a rank crash at 30% of the steps, the last node at 2/3.
    assert out["inject"] == "crash@step=4,rank=1;node-crash@step=10,node=node2"
    assert (out["nodes"], out["ranks_per_node"], out["ranks"]) == (3, 2, 6)
    assert (out["status"], out["exit_code"], out["completed_steps"]) == ("completed", 0, 16)
    assert out["unfired_faults"] == []
    assert [i["kind"] for i in out["interruptions"]] == ["crash", "node-lost"]
    assert out["interruptions"][0]["culprit_ranks"] == [1]
    assert out["final_loss"] is not None and 0 < out["ettr"] < 1
    records = events(tmp_path / "run")
    assert [(e["node"], e["attempt"]) for e in of_type(records, "node_excluded")] == [("node2", 2)]
    assert {p.name for p in (tmp_path / "run" / "events").glob("agent-*.jsonl")} == {
        "agent-node0.jsonl", "agent-node1.jsonl", "agent-node2.jsonl"}
    assert "demo: node2: killed (exit -9)" in res.stderr


def test_demo_refuses_a_node_fault_on_a_node_it_does_not_have(tmp_path: Path) -> None:
    res = trainguard("demo", "--nodes", "2", "--inject", "node-crash@step=2,node=5", "--run-dir",
                     str(tmp_path / "run"))
    assert res.returncode == 2 and "not one of the demo's nodes" in res.stderr, res.stderr
    assert not (tmp_path / "run").exists()
    res = trainguard("demo", "--nodes", "2", "--ranks", "3", "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 2 and "--ranks 3 is not --nodes x --ranks-per-node" in res.stderr, res.stderr
