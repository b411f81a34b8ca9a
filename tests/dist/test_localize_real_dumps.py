"""Localization on real flight-recorder dumps from real multi-process gloo jobs with planted faults."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.localize import diagnose_path

WORKER = Path(__file__).with_name("_localize_workers.py")
pytestmark = pytest.mark.slow


def run_job(out: Path, scenario: str, world: int, *, dead: tuple[int, ...] = (), timeout: float = 50) -> Path:
    """Start ``world`` gloo ranks, wait until every rank that can dump has dumped, kill them all."""
    out.mkdir(parents=True, exist_ok=True)
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), scenario, str(world), str(out), str(r)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for r in range(world)
    ]
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pending = [r for r in range(world) if not (out / f"ready_rank_{r}.flag").exists()]
            # a rank that exited (died on purpose or aborted by gloo) will never dump
            pending = [r for r in pending if procs[r].poll() is None]
            if not pending:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"{scenario}: ranks did not dump in time")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait(timeout=10)
    for r in dead:
        assert not (out / f"fr_trace_rank_{r}.pkl").exists()
    return out


def test_skipped_collective_is_a_hang_and_earlier_snapshot_is_healthy(tmp_path: Path) -> None:
    out = run_job(tmp_path / "skip", "skip", 3)
    healthy = diagnose_path(out / "healthy")
    assert healthy.verdict == "healthy", healthy.explanation
    assert healthy.culprit_ranks == () and healthy.problems == ()
    rep = diagnose_path(out, {0: "node-a", 1: "node-b", 2: "node-a"})
    assert rep.verdict == "hang", rep.explanation
    assert rep.culprit_ranks == (1,)
    assert rep.culprit_hosts == ("node-b",)
    assert rep.process_group == "0" and rep.collective_seq == 4 and rep.op == "all_reduce"
    assert rep.problems[0].waiting_ranks == (0, 2)


def test_different_collective_is_a_desync(tmp_path: Path) -> None:
    rep = diagnose_path(run_job(tmp_path, "desync", 3))
    assert rep.verdict == "desync", rep.explanation
    assert rep.culprit_ranks == (1,)
    assert rep.collective_seq == 3 and rep.op == "all_reduce"
    ops = {e.rank: e.op for e in rep.problems[0].evidence}
    assert ops[1] == "broadcast"


def test_size_mismatch_is_the_verdict_even_when_receivers_abort(tmp_path: Path) -> None:
    out = run_job(tmp_path, "size", 4)
    rep = diagnose_path(out)
    assert rep.verdict == "mismatch", rep.explanation
    assert rep.culprit_ranks == (1,)
    assert rep.collective_seq == 3
    missing = {r for r in range(4) if not (out / f"fr_trace_rank_{r}.pkl").exists()}
    assert set(rep.problems[0].consequence_ranks) == missing
    assert all(p.verdict != "crash" for p in rep.problems)


def test_dead_rank_is_a_crash(tmp_path: Path) -> None:
    rep = diagnose_path(run_job(tmp_path, "die", 3, dead=(1,)))
    assert rep.verdict == "crash", rep.explanation
    assert rep.culprit_ranks == (1,)
    assert rep.missing_ranks == (1,)
    assert rep.collective_seq == 3


@pytest.mark.parametrize("seen", ["stopped", "unanswered"])
def test_a_rank_the_supervisor_saw_alive_but_silent_is_a_hang_not_a_crash(tmp_path: Path, seen: str) -> None:
    # The same dumps as a dead rank's, but the supervisor saw rank 1 stopped (kill -STOP) or silent when it
    # gathered them, and said so beside the dumps: diagnose must agree with the agent's hang verdict.
    out = run_job(tmp_path, "die", 3, dead=(1,))
    (out / "process_state.json").write_text(json.dumps({seen: [1], "answered": [0, 2]}))
    rep = diagnose_path(out)
    assert rep.verdict == "hang", rep.explanation
    assert rep.culprit_ranks == (1,)
    assert ("stopped" if seen == "stopped" else "silent") in rep.explanation
    (out / "process_state.json").write_text(json.dumps({"stopped": "1"}))  # not what the supervisor writes
    assert diagnose_path(out).verdict == "crash"


def test_hang_inside_a_subgroup_while_other_groups_are_healthy(tmp_path: Path) -> None:
    rep = diagnose_path(run_job(tmp_path, "subgroup", 4))
    assert rep.verdict == "hang", rep.explanation
    assert rep.culprit_ranks == (3,)
    assert len(rep.problems) == 1
    prob = rep.problems[0]
    assert prob.waiting_ranks == (2,)
    assert set(prob.group_ranks) == {2, 3}
    assert prob.process_group != "0"


# --- jobs that also send and receive: gloo records no send/recv ----------------------------------------


def test_pipeline_stage_that_never_sends_is_a_hang_not_healthy(tmp_path: Path) -> None:
    # 4 stages; stage 2 receives its input and never sends: stage 3 waits in a receive gloo does not
    # record, stages 0 and 1 wait in the next all-reduce. Every recorded collective matches.
    out = run_job(tmp_path, "pipeline", 4)
    for snapshot in (out, out / "late"):  # during the hang, and after gloo timed the waiting work out
        rep = diagnose_path(snapshot)
        assert rep.verdict == "hang", (snapshot, rep.explanation)
        assert rep.culprit_ranks == (2, 3)
        assert rep.process_group == "0" and rep.collective_seq == 5 and rep.op == "all_reduce"
        assert rep.problems[0].waiting_ranks == (0, 1)
        assert any(m.startswith("send/recv") for m in rep.problems[0].missing_records)
        assert "gloo records no send/recv" in rep.explanation
    assert "retired" in diagnose_path(out / "late").explanation
    # before the fault: nothing recorded is wrong, but the unrecorded send/recv could hide a hang
    before = diagnose_path(out / "healthy")
    assert before.verdict == "insufficient-evidence", before.explanation
    assert before.culprit_ranks == () and any(m.startswith("send/recv") for m in before.missing_records)


def test_skipped_send_between_tensor_parallel_stages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # stages {0, 1} -> {2, 3}, tp pairs within a stage; rank 0 skips one send and goes on to the
    # all-reduce: rank 2 waits in its receive, so its tp partner 3 waits in the tp all-reduce.
    out = run_job(tmp_path, "tp_pipeline", 4)
    for snapshot in (out, out / "late"):
        rep = diagnose_path(snapshot)
        assert rep.verdict == "p2p-hang", (snapshot, rep.explanation)
        assert rep.culprit_ranks == (0,)
        assert rep.process_group == "0" and rep.collective_seq is None
        assert set(rep.problems[0].waiting_ranks) == {2, 3}
        by_group = {p.process_group: p for p in rep.problems if p.verdict == "hang"}
        tp = [p for g, p in by_group.items() if g != "0"]
        assert len(tp) == 1 and tp[0].culprit_ranks == (2,) and tp[0].waiting_ranks == (3,)
        assert tp[0].blocked_by == (0,)
        assert by_group["0"].culprit_ranks == (2, 3)
    from trainguard.cli import main

    assert main(["diagnose", str(out), "--json"]) == 1
    assert '"verdict": "p2p-hang"' in capsys.readouterr().out


# --- a rank dies inside a tensor-parallel sub-group collective and leaves no dump ----------------------


# Two live runs here; tests/unit/test_localize_membership.py runs every layout and position on dumps
# recorded from this same job (tests/dist/record_subgroup_dumps.py).
@pytest.mark.parametrize(("tp", "dead"), [(4, 5), (2, 2)])
def test_rank_lost_in_a_subgroup_collective_is_the_crash_culprit(tmp_path: Path, tp: int, dead: int) -> None:
    # 8 ranks in tensor-parallel groups of tp consecutive ranks (tp=4: 2 groups of 4; tp=2: 4 groups of
    # 2), each step an all-reduce in the group then one over every rank. The dead rank's peers block in
    # the group's collective, the other groups wait in the next world one. gloo names no members, so the
    # dead rank is in no group's entries: it must be placed from its siblings' layout.
    out = run_job(tmp_path, f"tpdie-{tp}-{dead}", 8, dead=(dead,), timeout=240)
    healthy = diagnose_path(out / "healthy", world_size=8)
    assert healthy.verdict == "healthy", healthy.explanation
    hosts = {r: f"node-{r // 4}" for r in range(8)}
    rep = diagnose_path(out, hosts, world_size=8)
    assert rep.verdict == "crash", rep.explanation
    assert rep.culprit_ranks == (dead,)
    assert rep.culprit_hosts == (f"node-{dead // 4}",)
    group = set(range(dead - dead % tp, dead - dead % tp + tp))
    top = rep.problems[0]
    assert set(top.group_ranks) == group and top.process_group != "0"
    assert top.waiting_ranks == tuple(sorted(group - {dead}))  # the peers wait, they are not culprits
    world = next(p for p in rep.problems if p.process_group == "0")
    assert world.culprit_ranks == (dead,)
    assert set(world.waiting_ranks) == set(range(8)) - group
    assert world.blocked_by == (0,)
    assert all(set(p.culprit_ranks) == {dead} for p in rep.problems)
