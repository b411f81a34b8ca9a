"""`trainguard demo` trains through its default crash and hang and ends where a fault-free run ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e._run_helpers import TINY_DEMO, events, of_type, trainguard


def _demo(run_dir: Path, *extra: str) -> tuple[dict, str]:
    res = trainguard("demo", "--ranks", "2", "--steps", "16", "--ckpt-every", "3", "--seed", "7",
                     "--model", TINY_DEMO, "--hang-floor", "3", "--run-dir", str(run_dir), "--json", *extra,
                     timeout=170)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout), res.stderr


@pytest.mark.slow
def test_demo_recovers_from_crash_and_hang_with_the_fault_free_loss(tmp_path: Path) -> None:
    faulty, console = _demo(tmp_path / "faulty")
    # The console says what happened: one line per detection, diagnosis and restart, then a summary;
    # rank 0's own progress lines come through with its prefix.
    lines = console.splitlines()
    for word, count in ((" detected in attempt ", 2), ("diagnosis of attempt", 2), ("restart: attempt", 2),
                        ("summary: completed", 1)):
        assert sum(line.startswith("demo: ") and word in line for line in lines) == count, (word, console)
    assert any(line.startswith("[rank0]: train_gpt: step 10/16") for line in lines), console
    assert faulty["unfired_faults"] == []
    assert faulty["status"] == "completed"
    assert faulty["completed_steps"] == faulty["target_steps"] == 16
    assert [(i["kind"], i["culprit_ranks"]) for i in faulty["interruptions"]] == [("crash", [1]), ("hang", [0])]
    assert faulty["interruptions"][1]["detection_latency_seconds"] < 3 + 5
    assert 0 < faulty["ettr"] < 1
    # Steps re-executed after the restarts really ran again (nothing skipped, nothing applied twice).
    records = events(tmp_path / "faulty", "rank-0")
    assert len({s["attempt"] for s in of_type(records, "step_completed")}) == 3

    clean, _ = _demo(tmp_path / "clean", "--inject", "none")
    assert clean["interruptions"] == [] and clean["completed_steps"] == 16
    assert faulty["final_loss"] is not None and clean["final_loss"] is not None
    assert abs(faulty["final_loss"] - clean["final_loss"]) <= 1e-6
    # The loss really moved (training happened), so the equality above is not a constant's.
    first = [s for s in of_type(events(tmp_path / "clean", "rank-0"), "step_completed") if s["step"] == 1]
    assert first[0]["loss"] - clean["final_loss"] > 0.1


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
