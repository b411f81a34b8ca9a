"""Lemon-node scoring: pure scoring over history rows, and end to end over a real fleet database."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainguard.classify import classify_text
from trainguard.cli import main
from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    Diagnosis,
    FailureDetected,
    HealthCheckResult,
    NodeExcluded,
    RunEnded,
    RunStarted,
)
from trainguard.core.rundir import RunDir
from trainguard.health.fleetdb import FleetDB
from trainguard.health.lemon import LemonPolicy, flagged_hosts, rank_hosts, score_hosts

NOW = 1_800_000_000.0
XID_EVIDENCE = classify_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
                             "kern.log").evidence_strings()
DAY = 86400.0


@dataclass(frozen=True)
class Row:
    host: str
    run_id: str
    time: float
    kind: str
    detail: str = ""


def incident(host: str, run: str, t: float) -> list[Row]:
    """What one failure blamed on ``host`` leaves in its history."""
    return [Row(host, run, t, "culprit", "Faulty GPU"), Row(host, run, t, "failure", "crash"),
            Row(host, run, t + 5, "excluded", "culprit")]


def test_two_incidents_flag_a_host_one_bad_day_does_not() -> None:
    rows = incident("lemon", "r1", NOW - 3 * DAY) + incident("lemon", "r2", NOW - DAY)
    rows += incident("unlucky", "r3", NOW - DAY)
    scores = {s.host: s for s in score_hosts(rows, now=NOW)}
    assert scores["lemon"].flagged and scores["lemon"].incidents == 2
    assert scores["unlucky"].score >= LemonPolicy().threshold
    assert not scores["unlucky"].flagged and scores["unlucky"].incidents == 1
    assert [s.host for s in score_hosts(rows, now=NOW)] == ["lemon", "unlucky"]
    assert any(r == "named culprit 2x (Faulty GPU x2)" for r in scores["lemon"].reasons)


def test_old_history_decays() -> None:
    rows = incident("old", "r1", NOW - 200 * DAY) + incident("old", "r2", NOW - 190 * DAY)
    [s] = score_hosts(rows, now=NOW)
    assert not s.flagged and s.score < 0.5
    [s] = score_hosts(rows, now=NOW, policy=LemonPolicy(half_life_days=0))
    assert s.flagged


def test_hardware_xids_weigh_more_than_application_xids() -> None:
    hw = [Row("a", f"r{i}", NOW - i * 1000, "xid", "79") for i in range(4)]
    app = [Row("b", f"r{i}", NOW - i * 1000, "xid", "13") for i in range(4)]
    scores = {s.host: s for s in score_hosts(hw + app, now=NOW)}
    assert scores["a"].flagged and not scores["b"].flagged
    assert scores["a"].counts == {"xid_hardware": 4} and scores["b"].counts == {"xid_application": 4}


def test_failed_attempt_participation_counts_only_above_the_fleet_median() -> None:
    rows = []
    for i in range(12):  # the suspect was in 12 failed attempts; its peers in 2 each
        rows.append(Row("suspect", "r", NOW - i * 600, "failed_attempt_member", f"attempt {i}"))
    for peer in ("p1", "p2", "p3"):
        rows += [Row(peer, "r", NOW - i * 600, "failed_attempt_member", f"attempt {i}") for i in range(2)]
    rows += [Row("suspect", "r", NOW - 10, "check_failed", "gpu_ecc (high)"),
             Row("suspect", "r2", NOW - 9000, "check_failed", "gpu_ecc (high)")]
    scores = {s.host: s for s in score_hosts(rows, now=NOW)}
    assert scores["p1"].score == 0.0 and not scores["p1"].flagged
    assert scores["suspect"].flagged, scores["suspect"]
    assert any("failed attempts (fleet median 2)" in r for r in scores["suspect"].reasons)


def _write_run(root: Path, run_id: str, t0: float, culprit: str | None) -> RunDir:
    rd = RunDir(root / run_id).create()
    hosts = ("node-a", "node-b", "node-c")
    with rd.writer("agent-node-a") as w:
        w.write(RunStarted(time=t0, host="node-a", run_id=run_id, world_size=6, nnodes=3))
        w.write(AttemptStarted(time=t0 + 1, host="node-a", attempt=0, world_size=6, hosts=hosts))
        if culprit:
            w.write(FailureDetected(time=t0 + 100, host="node-a", attempt=0, kind="crash", hosts=(culprit,)))
            w.write(Diagnosis(time=t0 + 101, host="node-a", attempt=0, category="Faulty GPU", group="GPU",
                              culprit_hosts=(culprit,), confidence=0.9,
                              evidence=XID_EVIDENCE))
            w.write(AttemptEnded(time=t0 + 102, host="node-a", attempt=0, reason="failure"))
            w.write(HealthCheckResult(time=t0 + 110, host=culprit, name="injected", severity="high", ok=False))
            w.write(NodeExcluded(time=t0 + 111, host="node-a", node=culprit, reason="health check failed"))
        w.write(RunEnded(time=t0 + 500, host="node-a", run_id=run_id, status="completed"))
    return rd


def test_flagged_hosts_from_a_real_fleet_database(tmp_path: Path, fleet_db: str) -> None:
    db_path = fleet_db
    with FleetDB(db_path) as db:
        db.index_run(_write_run(tmp_path, "run-1", NOW - 2 * DAY, "node-b"))
        db.index_run(_write_run(tmp_path, "run-2", NOW - 1 * DAY, "node-b"))
        db.index_run(_write_run(tmp_path, "run-3", NOW - 1 * DAY + 3600, "node-c"))
        db.index_run(_write_run(tmp_path, "run-4", NOW, None))
    assert flagged_hosts(db_path) == {"node-b"}
    ranked = rank_hosts(db_path)
    assert ranked[0].host == "node-b" and ranked[0].counts["culprit"] == 2 and ranked[0].incidents >= 2
    assert ranked[0].counts["xid_hardware"] == 2
    with FleetDB(db_path) as db:  # the XID code reached the database through the evidence strings
        assert {r.detail for r in db.host_history("node-b") if r.kind == "xid"} == {"79"}
    assert not {s.host: s for s in ranked}["node-c"].flagged


def test_hosts_verb(tmp_path: Path, capsys: pytest.CaptureFixture[str], fleet_db: str) -> None:
    db_path = fleet_db
    with FleetDB(db_path) as db:
        for i in range(2):
            db.index_run(_write_run(tmp_path, f"run-{i}", NOW - i * DAY, "node-b"))
    assert main(["hosts", "--json", "--db", str(db_path)]) == 0
    docs = json.loads(capsys.readouterr().out)
    assert docs[0]["host"] == "node-b" and docs[0]["flagged"] is True
    assert set(docs[0]) == {"host", "score", "flagged", "reasons", "counts", "incidents", "runs", "last_seen",
                            "drains"}
    assert docs[0]["drains"] is None  # the drain policy never acted on it
    assert main(["hosts", "--db", str(db_path)]) == 0
    out = capsys.readouterr().out
    assert "LEMON" in out and "node-b" in out
    assert main(["hosts", "--db", str(tmp_path / "missing.db")]) == 3
    assert "no fleet database" in capsys.readouterr().err
    assert main(["hosts", "--db", str(db_path), "--threshold", "-1"]) == 2
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    assert main(["hosts", "--db", str(garbage)]) == 3


def test_low_severity_check_failures_never_make_a_lemon() -> None:
    rows = [Row("h", f"r{i}", NOW - i * 3600, "check_failed", "clock_sync (low)") for i in range(50)]
    rows += [Row("h", "r0", NOW, "check_failed", "gpu_ecc (high)")]
    [s] = score_hosts(rows, now=NOW)
    assert not s.flagged and s.score == pytest.approx(1.0) and s.incidents == 1
    assert s.counts == {"check_failed_low": 50, "check_failed": 1}


@pytest.mark.parametrize("line", [
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
    "Nov 30 09:00:01 node-7 kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=0, DBE (0x1) 172",
    "NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception",
    "training log: Xid: 79 mentioned in a comment",  # not the driver's line: no XID for anyone
    "xid 79",
])
def test_classifier_database_and_lemon_score_read_xids_alike(tmp_path: Path, line: str, fleet_db: str) -> None:
    """One XID parser: the database records a code exactly when the classifier reads the line as that XID,
    and the lemon score weighs it as the classifier's rule tier says."""
    c = classify_text(line, "kern.log")
    xid_rules = [e.rule for e in c.evidence if e.rule.startswith("xid-")]
    rd = RunDir(tmp_path / "run").create()
    with rd.writer("agent-node-a") as w:
        w.write(RunStarted(time=NOW, host="node-a", run_id="run", world_size=1, nnodes=1))
        w.write(Diagnosis(time=NOW + 1, host="node-a", attempt=0, category=c.category, group=c.group,
                          culprit_hosts=("node-a",), confidence=0.9, evidence=(line,)))
    with FleetDB(fleet_db) as db:
        db.index_run(rd)
        rows = [r for r in db.host_history("node-a") if r.kind == "xid"]
    assert [f"xid-{r.detail}" for r in rows] == xid_rules
    counts = score_hosts(rows, now=NOW).pop().counts if rows else {}
    hardware = {"xid-79": True, "xid-48": True, "xid-13": False}
    for rule in xid_rules:
        assert counts == ({"xid_hardware": 1} if hardware[rule] else {"xid_application": 1})
