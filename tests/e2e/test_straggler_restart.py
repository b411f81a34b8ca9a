"""Straggler policy ``restart-now`` on a real loopback job: two nodes and a waiting spare; the slow rank's node
leaves at once and the spare takes its place. Also the argument errors of the straggler and telemetry flags."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e._run_helpers import (
    ROOT,
    events,
    free_port,
    json_result,
    of_type,
    start_trainguard,
    trainguard,
    wait_for_store,
)

PLAIN_DDP = ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py"
STEPS = 160
SLOW_STEP = 40


@pytest.mark.slow
def test_restart_now_replaces_the_slow_node_by_the_waiting_spare(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    endpoint = f"127.0.0.1:{free_port()}"
    # A 2-node job (2:2) and three agents: the two that join first run it, the third waits as a spare.
    # Rank 1 turns 2x slow at step 40 of attempt 0 (paced 0.1 s steps: the spare has long been waiting).
    inject = f"slow@step={SLOW_STEP},rank=1,factor=2,attempt=0"
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(node: str) -> None:
        procs[node] = start_trainguard(
            "run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", endpoint, "--rdzv-id", "slowspare",
            "--node-id", node, "--run-dir", str(run_dir), "--json", "--no-health-checks", "--inject", inject,
            # Hangs are not under test: on a loaded machine a rank taking >4 s to exit after its last step
            # was once called a hang; the floor keeps the watchdog out of this test's way.
            "--hang-floor", "30",
            "--straggler-policy", "restart-now", "--straggler-probe-seconds", "1", "--telemetry-seconds", "1",
            "--", str(PLAIN_DDP), "--steps", str(STEPS), "--ckpt-dir", str(tmp_path / "ck"), "--ckpt-every", "10",
            "--step-seconds", "0.1", log=tmp_path / f"{node}.log")

    try:
        start("node0")
        wait_for_store(endpoint, procs["node0"])
        start("node1")
        start("node2")
        codes = {node: p.wait(timeout=240) for node, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    logs = {n: (tmp_path / f"{n}.log").read_text()[-3000:] for n in procs}
    records = events(run_dir)
    first = {a["host"] for a in of_type(records, "attempt_started") if a["attempt"] == 0}
    assert len(first) == 2, logs
    (spare,) = set(procs) - first
    slow_node = next(s["host"] for s in of_type(records, "step_completed") if s["rank"] == 1 and s["attempt"] == 0)

    # The leader named rank 1 and, a spare waiting, decided restart-now.
    named = of_type(records, "straggler_detected")
    assert [(d["rank"], d["node"], d["attempt"], d["action"]) for d in named] == [
        (1, slow_node, 0, "restart-now")], logs
    actions = of_type(records, "straggler_action")
    assert [(a["policy"], a["action"], a["node"]) for a in actions] == [("restart-now", "restart-now", slow_node)]
    assert actions[0]["spares_waiting"] >= 1
    # The slow node ended attempt 0 as a planned interruption (nobody recorded a failure) and left at the restart.
    planned = of_type(records, "planned_interruption")
    assert [(p["host"], p["attempt"]) for p in planned] == [(slow_node, 0)]
    assert planned[0]["reason"].startswith("straggler: rank 1")
    assert of_type(records, "failure_detected") == []
    # Every node ended attempt 0 as planned: the peer's workers failing when the slow node's stopped is no failure.
    assert {(e["host"], e["reason"]) for e in of_type(records, "attempt_ended") if e["attempt"] == 0} == {
        (n, "planned") for n in first}, logs
    excluded = of_type(records, "node_excluded")
    assert [(e["node"], e["attempt"]) for e in excluded] == [(slow_node, 1)]
    assert excluded[0]["reason"].startswith("straggler: rank 1")
    assert codes[slow_node] == 5 and json_result(tmp_path / f"{slow_node}.log")["status"] == "excluded", logs
    # The spare ran the rest of the job with the remaining node, and the job completed every step.
    others = {n for n in procs if n != slow_node}
    assert {n: codes[n] for n in others} == dict.fromkeys(others, 0), logs
    final = max(a["attempt"] for a in of_type(records, "attempt_started"))
    assert final >= 1
    assert {a["host"] for a in of_type(records, "attempt_started") if a["attempt"] == final} == others
    assert spare in others
    last = [s for s in of_type(records, "step_completed") if s["attempt"] == final]
    assert max(s["step"] for s in last if s["host"] == spare) == STEPS
    ended = of_type(records, "run_ended")
    assert [(e["status"], e["completed_steps"]) for e in ended] == [("completed", STEPS)]
    # The flags reached the agents' configuration as given.
    (started,) = of_type(records, "run_started")
    config = started["config"]
    assert (config["straggler_policy"], config["straggler_probe_seconds"], config["telemetry_seconds"]) == (
        "restart-now", 1.0, 1.0)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--straggler-policy", "shoot", "--straggler-policy must be one of report, exclude-next-restart, restart-now"),
    ("--straggler-probe-seconds", "-1", "--straggler-probe-seconds must be 0 (off) or from 0.5 to 86400"),
    ("--straggler-probe-seconds", "0.01", "--straggler-probe-seconds must be 0 (off) or from 0.5 to 86400"),
    ("--telemetry-seconds", "nan", "--telemetry-seconds must be 0 (off) or from 0.5 to 86400"),
    ("--telemetry-seconds", "1e9", "--telemetry-seconds must be 0 (off) or from 0.5 to 86400"),
])
@pytest.mark.parametrize("verb", ["run", "demo"])
def test_bad_straggler_and_telemetry_flags_are_usage_errors(tmp_path: Path, verb: str, flag: str, value: str,
                                                           message: str) -> None:
    args = ["--standalone", "--run-dir", str(tmp_path / "r"), flag, value, str(PLAIN_DDP), "--ckpt-dir", "x"] \
        if verb == "run" else ["--run-dir", str(tmp_path / "r"), flag, value]
    res = trainguard(verb, *args)
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "r").exists()  # refused before anything was created
