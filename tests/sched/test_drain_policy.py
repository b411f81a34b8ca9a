"""The drain policy without a scheduler: a recording adapter stands in for Slurm/Kubernetes (the real ones are
tested in test_slurm_drain.py and test_kubernetes_adapter.py). Rate limit, cluster limit, window, ledger shared
by agents, verdicts from diagnoses, the way back, the records and what the fleet view makes of them."""

from __future__ import annotations

import json
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli import main
from trainguard.core.event_decoding import from_dict
from trainguard.core.eventlog import EventWriter
from trainguard.core.events import Diagnosis, NodeDrained, NodeReturned, RunStarted
from trainguard.health.base import CheckResult
from trainguard.health.drain import (
    DrainPolicy,
    DrainSettings,
    Verdict,
    after_admission,
    diagnosis_verdicts,
    drain_verdicts,
    return_node,
)
from trainguard.health.drain_history import summarize
from trainguard.health.fleetdb import FleetDB
from trainguard.health.scheduler import NodeState, Owner, SchedulerError, drain_reason
from trainguard.launch.config import SupervisorConfig


class FakeScheduler:
    """An in-memory scheduler with the adapter interface; ``fail`` makes every call raise."""

    name = "fake"

    def __init__(self, nodes: list[str], job: list[str] | None = None) -> None:
        self.nodes = {n: NodeState(n, "idle", False) for n in nodes}
        self.job = job if job is not None else list(nodes)
        self.calls: list[tuple[str, str]] = []
        self.fail = False
        self.lock = threading.Lock()

    def _check(self) -> None:
        if self.fail:
            raise SchedulerError("slurmctld did not answer")

    def drain(self, node: str, reason: str) -> None:
        self._check()
        with self.lock:
            self.calls.append(("drain", node))
            self.nodes[node] = NodeState(node, "drained", True, reason, 1.0, "root")

    def resume(self, node: str) -> None:
        self._check()
        self.calls.append(("resume", node))
        self.nodes[node] = NodeState(node, "idle", False)

    def node(self, node: str) -> NodeState:
        self._check()
        if node not in self.nodes:
            raise KeyError(node)
        return self.nodes[node]

    def drained(self) -> list[NodeState]:
        self._check()
        return [s for s in self.nodes.values() if s.drained]

    def job_nodes(self) -> list[str]:
        self._check()
        return list(self.job)

    def cluster_nodes(self) -> list[str]:
        self._check()
        return list(self.nodes)


NODES = [f"n{i}" for i in range(1, 9)]
OWNER = Owner(1000, "alice", "4711")
ME = Owner.current().tag()


def policy(tmp_path: Path, sched: FakeScheduler, clock: list[float], **kw: Any) -> DrainPolicy:
    settings = DrainSettings(**{"max_share": 0.25, "window_seconds": 3600, "max_cluster_share": 1.0, **kw})
    return DrainPolicy(settings, sched, tmp_path / "run", "job7", "n1", clock=lambda: clock[0], owner=OWNER)


def test_rate_limit_counts_the_jobs_nodes_within_the_window(tmp_path: Path) -> None:
    sched, clock = FakeScheduler(NODES), [10_000.0]
    p = policy(tmp_path, sched, clock)
    assert p.decide(Verdict("n2", "lost", "node lost", 0)).status == "drained"
    assert p.decide(Verdict("n3", "health", "failed health check gpu_ecc", 1)).status == "drained"
    third = p.decide(Verdict("n4", "hardware", "Xid 79", 2))
    assert third.status == "refused" and "2 of the job's 8 nodes" in third.detail and "max_share 0.25" in third.detail
    assert ("drain", "n4") not in sched.calls and not sched.nodes["n4"].drained
    clock[0] += 3601  # the window moved on
    assert p.decide(Verdict("n4", "hardware", "Xid 79", 3)).status == "drained"
    assert [c for c in sched.calls if c[0] == "drain"] == [("drain", "n2"), ("drain", "n3"), ("drain", "n4")]


def test_a_small_job_drains_nothing_and_the_cluster_limit_holds(tmp_path: Path) -> None:
    clock = [1.0]
    small = FakeScheduler(NODES, job=["n1", "n2", "n3"])
    refused = policy(tmp_path / "a", small, clock).decide(Verdict("n2", "lost", "node lost", 0))
    assert refused.status == "refused" and "0.75 nodes" in refused.detail  # 0.25 x 3 < 1
    big = FakeScheduler([f"h{i}" for i in range(20)])
    big.nodes["h9"] = NodeState("h9", "drained", True, "trainguard: earlier job", 1.0)
    p = policy(tmp_path / "b", big, clock, max_share=1.0, max_cluster_share=0.1)
    assert p.decide(Verdict("h1", "lost", "node lost", 0)).status == "drained"  # 2 of 20 = 0.1
    third = p.decide(Verdict("h2", "lost", "node lost", 0))
    assert third.status == "refused" and "cluster limit" in third.detail


def test_nodes_drained_already_are_not_drained_again_or_counted(tmp_path: Path) -> None:
    sched, clock = FakeScheduler(NODES), [5.0]
    sched.nodes["n5"] = NodeState("n5", "drained", True, "bad fan", 1.0, "ops")
    p = policy(tmp_path, sched, clock)
    record = p.decide(Verdict("n5", "lost", "node lost", 0))
    assert record.status == "already-drained" and "drained by ops: bad fan" in record.detail
    assert p.decide(Verdict("n2", "lost", "node lost", 0)).status == "drained"
    assert p.decide(Verdict("n2", "health", "again", 1)).status == "already-drained"
    assert p.decide(Verdict("n3", "lost", "node lost", 1)).status == "drained"  # n5 and the repeat did not count


def test_scheduler_failures_and_disabled_causes_are_records_not_exceptions(tmp_path: Path) -> None:
    sched, clock = FakeScheduler(NODES), [5.0]
    sched.fail = True
    record = policy(tmp_path, sched, clock).decide(Verdict("n2", "lost", "node lost", 0))
    assert record.status == "failed" and "slurmctld did not answer" in record.detail
    sched.fail = False
    only_health = policy(tmp_path / "h", sched, clock, causes=("health",))
    assert only_health.decide(Verdict("n2", "lemon", "lemon", 0)).status == "refused"
    ghost = FakeScheduler(NODES, job=[*NODES, "n99"])  # in the allocation, unknown to the scheduler
    assert policy(tmp_path / "u", ghost, clock).decide(Verdict("n99", "lost", "x", 0)).status == "failed"


def _decide_in_process(run: str, node: str, out: Any) -> None:
    sched = FakeScheduler(NODES)
    p = DrainPolicy(DrainSettings(max_share=0.25, max_cluster_share=1.0), sched, Path(run), "job7", node)
    out.put(p.decide(Verdict(node, "lost", "node lost", 0)).status)


def test_agents_deciding_at_once_share_one_limit(tmp_path: Path) -> None:
    """Eight agents (processes) each drain themselves at the same moment: the ledger lets exactly two through."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_decide_in_process, args=(str(tmp_path / "run"), n, queue)) for n in NODES]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    statuses = sorted(queue.get(timeout=5) for _ in procs)
    assert statuses == ["drained"] * 2 + ["refused"] * 6
    assert len(list((tmp_path / "run" / "drains").glob("drain-*.json"))) == 8


def test_reasons_are_one_readable_line_that_says_trainguard(tmp_path: Path) -> None:
    assert (drain_reason("Xid 79 GPU 0000:18:00", "R", 2, OWNER)
            == "trainguard: Xid 79 GPU 0000:18:00, run R attempt 2 [uid 1000 alice job 4711]")
    long = drain_reason("failed health check " + "x" * 500 + "\nsecond line", "R", 1, OWNER)
    assert len(long) <= 200 and long.startswith("trainguard: ")
    assert long.endswith(", run R attempt 1 [uid 1000 alice job 4711]")  # the owner tag survives the cut
    assert "\n" not in long
    d = Diagnosis(time=1.0, host="n1", attempt=2, category="Faulty GPU", group="GPU", confidence=0.9,
                  culprit_hosts=("n4",),
                  evidence=("NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.",))
    [v] = diagnosis_verdicts(d, 0.5)
    assert (v.node, v.cause) == ("n4", "hardware")
    expected = "trainguard: Xid 79 GPU 0000:18:00 (Faulty GPU), run R attempt 2"
    assert drain_reason(v.what, "R", v.attempt) == expected + ME
    software = Diagnosis(time=1.0, attempt=1, category="Software Bug", group="Dependency", confidence=1.0,
                         culprit_hosts=("n4",))
    assert diagnosis_verdicts(software, 0.5) == []
    assert diagnosis_verdicts(Diagnosis(time=1.0, attempt=1, category="NIC", group="Host", confidence=0.3,
                                        culprit_hosts=("n4",)), 0.5) == []


def test_the_agent_hook_emits_a_record_and_never_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sched = FakeScheduler(NODES)
    monkeypatch.setattr("trainguard.health.drain.open_adapter", lambda kind: sched)
    cfg = SupervisorConfig(command=("t.py",), run_dir=tmp_path / "run", run_id="job7", node_id="n3",
                           rdzv_endpoint="h:1", max_nodes=8, drain=DrainSettings(max_cluster_share=1.0))
    emitted: list[Any] = []
    after_admission(cfg, 1, ["injected: node marked unhealthy"], False, emitted.append)
    [record] = emitted
    assert isinstance(record, NodeDrained) and record.status == "drained" and record.cause == "health"
    assert record.reason == "trainguard: failed health check injected: node marked unhealthy, run job7 attempt 1" + ME
    off = SupervisorConfig(command=("t.py",), run_dir=tmp_path / "run", run_id="job7", node_id="n3",
                           rdzv_endpoint="h:1")
    after_admission(off, 1, ["injected"], False, emitted.append)
    assert len(emitted) == 1  # drain=None: nothing at all

    def broken(kind: str) -> Any:
        raise RuntimeError("no scheduler")

    monkeypatch.setattr("trainguard.health.drain.open_adapter", broken)
    [failed] = drain_verdicts(cfg, [Verdict("n4", "lost", "node lost", 1)], emitted.append)
    assert failed.status == "failed" and "no scheduler" in failed.detail


def test_return_needs_passing_checks_and_a_trainguard_drain() -> None:
    sched = FakeScheduler(NODES)
    sched.drain("n2", drain_reason("node lost", "R", 0))
    sched.nodes["n3"] = NodeState("n3", "drained", True, "RMA ticket 42", 1.0, "ops")
    results = iter([[CheckResult("gpu_ecc", "high", True)], [CheckResult("gpu_ecc", "high", False, "3 errors")]])
    sleeps: list[float] = []
    out = return_node(sched, "n2", lambda: next(results), passes=3, interval_seconds=7, sleep=sleeps.append)
    assert out.status == "unhealthy" and "round 2 of 3" in out.detail and out.passes == 1 and sleeps == [7]
    assert sched.nodes["n2"].drained
    good = [CheckResult("gpu_ecc", "high", True), CheckResult("clock_sync", "low", False, "unsynced")]
    out = return_node(sched, "n2", lambda: good, passes=2, interval_seconds=0, sleep=sleeps.append)
    assert out.status == "returned" and not sched.nodes["n2"].drained  # low-severity findings do not block
    assert return_node(sched, "n2", lambda: good, passes=1).status == "refused"  # not drained now
    refused = return_node(sched, "n3", lambda: good, passes=1)
    assert refused.status == "refused" and "not by trainguard" in refused.detail and "RMA ticket 42" in refused.detail
    assert return_node(sched, "n99", lambda: good, passes=1).status == "refused"


def test_records_round_trip_and_reach_the_fleet_view(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     fleet_db: str) -> None:
    drained = NodeDrained(time=1000.0, host="n1", node="n2", status="drained", cause="lost",
                          reason="trainguard: node lost, run R attempt 0", scheduler="slurm", attempt=0)
    assert from_dict(json.loads(json.dumps(drained.to_dict()))) == drained
    returned = NodeReturned(time=2000.0, host="n2", node="n2", scheduler="slurm", passes=3,
                            drained_reason=drained.reason, drained_since=1000.0)
    assert from_dict(json.loads(json.dumps(returned.to_dict()))) == returned
    # an older reader skips unknown types; this one names a bad field
    with pytest.raises(ValueError, match="bad node_drained record: field 'status'"):
        from_dict({"type": "node_drained", "time": 1.0, "node": "n2", "status": 3})
    run = tmp_path / "run"
    with EventWriter(run / "events" / "agent-n1.jsonl") as w:
        w.write(RunStarted(time=900.0, host="n1", run_id="R"))
        w.write(drained)
        w.write(NodeDrained(time=1001.0, host="n1", node="n3", status="refused", cause="health",
                            reason="trainguard: failed health check", detail="rate limit: ..."))
        w.write(returned)
        w.write(NodeDrained(time=2000.0 + 3600, host="n1", node="n2", status="drained", cause="hardware",
                            reason="trainguard: Xid 79, run R attempt 3"))
    db = fleet_db
    with FleetDB(db) as fleet:
        fleet.index(run)
        history = fleet.drain_history()
    assert [(r.host, r.kind) for r in history] == [("n2", "drained"), ("n3", "drain_refused"), ("n2", "returned"),
                                                   ("n2", "drained")]
    summary = summarize(history)
    assert summary["n2"].state == "drained" and summary["n2"].redrained
    assert summary["n2"].redrained_after_seconds == 3600
    assert summary["n3"].state == "never drained" and summary["n3"].refused == 1
    assert not summarize(history, redrain_window_seconds=60)["n2"].redrained
    assert main(["hosts", "--db", str(db), "--drained", "--json"]) == 0
    docs = {d["host"]: d for d in json.loads(capsys.readouterr().out)}
    assert set(docs) == {"n2", "n3"}
    assert docs["n2"]["drains"]["drained"] == 2 and docs["n2"]["drains"]["redrained"] is True
    assert docs["n2"]["score"] == 0  # drains are not lemon evidence themselves
    assert main(["hosts", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert "drained by trainguard" in text and "DRAINED AGAIN" in text and "trainguard: Xid 79" in text


def test_failure_path_hooks_decide_off_the_critical_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainguard.health.drain import after_diagnosis, after_lost

    sched = FakeScheduler(NODES)
    monkeypatch.setattr("trainguard.health.drain.open_adapter", lambda kind: sched)
    cfg = SupervisorConfig(command=("t.py",), run_dir=tmp_path / "run", run_id="job7", node_id="n1",
                           rdzv_endpoint="h:1", max_nodes=8, node_lost_timeout_seconds=10,
                           drain=DrainSettings(max_share=0.5, max_cluster_share=1.0))
    emitted: list[Any] = []
    diagnosis = Diagnosis(time=1.0, host="n1", attempt=3, category="GPU HBM3 Memory", group="GPU", confidence=0.8,
                          culprit_hosts=("n6",), evidence=("NVRM: Xid (PCI:0000:3b:00): 48, pid=9, DBE",))
    after_diagnosis(cfg, diagnosis, emitted.append)
    after_lost(cfg, 3, ["n7"], emitted.append)
    for t in [t for t in threading.enumerate() if t.name == "trainguard-drain"]:
        t.join(10)
    by_node = {r.node: r for r in emitted}
    assert by_node["n6"].reason == "trainguard: Xid 48 GPU 0000:3b:00 (GPU HBM3 Memory), run job7 attempt 3" + ME
    assert by_node["n7"].reason == "trainguard: node lost (agent silent for 10 s), run job7 attempt 3" + ME
    assert {r.status for r in emitted} == {"drained"}


def test_a_node_outside_the_allocation_is_never_drained(tmp_path: Path) -> None:
    """A verdict naming a node of another job (a wrong --node-id, a culprit host read from a log) is refused
    without a single scheduler call about that node; an unknown allocation refuses everything."""
    sched, clock = FakeScheduler(NODES, job=["n1", "n2", "n3", "n4"]), [100.0]
    p = policy(tmp_path, sched, clock, max_share=1.0)
    record = p.decide(Verdict("n7", "hardware", "Xid 79", 1))
    assert record.status == "refused" and "not in the job's allocation (4 nodes)" in record.detail
    assert sched.calls == [] and not sched.nodes["n7"].drained
    assert "n7" in json.dumps(p.ledger.entries())  # the refusal is in the run's ledger
    assert p.decide(Verdict("n2", "hardware", "Xid 79", 1)).status == "drained"
    unknown = FakeScheduler(NODES, job=[])
    record = policy(tmp_path / "u", unknown, clock, max_share=1.0).decide(Verdict("n2", "lost", "node lost", 0))
    assert record.status == "refused" and "allocation is unknown" in record.detail and unknown.calls == []


def test_the_rate_limit_base_is_the_allocation_not_nnodes_max(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``--nnodes 1:8`` on a 4-node allocation: 0.25 of 4 is one drain, not two."""
    sched = FakeScheduler(NODES, job=["n1", "n2", "n3", "n4"])
    monkeypatch.setattr("trainguard.health.drain.open_adapter", lambda kind: sched)
    cfg = SupervisorConfig(command=("t.py",), run_dir=tmp_path / "run", run_id="job7", node_id="n1",
                           rdzv_endpoint="h:1", min_nodes=1, max_nodes=8,
                           drain=DrainSettings(max_share=0.25, max_cluster_share=1.0))
    emitted: list[Any] = []
    records = drain_verdicts(cfg, [Verdict("n2", "lost", "node lost", 1), Verdict("n3", "lost", "node lost", 1),
                                   Verdict("n8", "lost", "node lost", 1)], emitted.append)
    assert [r.status for r in records] == ["drained", "refused", "refused"]
    assert "of the job's 4 nodes" in records[1].detail and "not in the job's allocation" in records[2].detail
    assert emitted == records and [c for c in sched.calls if c[0] == "drain"] == [("drain", "n2")]


def test_return_only_for_this_users_drains_judged_by_the_nodes_own_rounds() -> None:
    sched = FakeScheduler(NODES)
    mine = Owner.current()
    other = Owner(mine.uid + 1, "mallory", "999")
    sched.drain("n2", drain_reason("node lost", "R", 0, other))
    sched.drain("n3", "trainguard: node lost, run R attempt 0")  # no owner tag: cannot say whose
    sched.drain("n4", drain_reason("node lost", "R", 0, mine))
    good = [CheckResult("gpu_ecc", "high", True)]
    refused = return_node(sched, "n2", lambda: good, passes=1)
    assert refused.status == "refused" and "user mallory" in refused.detail and "job 999" in refused.detail
    assert return_node(sched, "n3", lambda: good, passes=1).status == "refused"
    assert sched.nodes["n2"].drained and sched.nodes["n3"].drained and ("resume", "n2") not in sched.calls
    # judged by rounds the node recorded: too few, a failing one among the last, then enough passing ones
    bad = (CheckResult("gpu_ecc", "high", False, "3 errors"),)
    rounds: list[tuple[CheckResult, ...]] = [tuple(good)]
    out = return_node(sched, "n4", passes=2, recorded=lambda st: rounds)
    assert out.status == "refused" and "1 health round(s) recorded by node n4" in out.detail
    rounds = [tuple(good), bad]
    assert return_node(sched, "n4", passes=2, recorded=lambda st: rounds).status == "unhealthy"
    rounds = [bad, tuple(good), tuple(good)]
    out = return_node(sched, "n4", passes=2, recorded=lambda st: rounds)
    assert out.status == "returned" and not sched.nodes["n4"].drained
