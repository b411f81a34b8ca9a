"""The fleet database shared by many writers, and read alike on both engines.

Agents of several jobs on several hosts append to their runs and index them at once, into one SQLite file or one
PostgreSQL database: nothing is lost and nothing duplicated (the result equals indexing the finished runs one
after the other into a fresh file). ``trainguard hosts`` and the dashboard's run list read the same answers from
a server as from a file.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.postgres_server import PostgresServer
from trainguard.cli import main
from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    Diagnosis,
    FailureDetected,
    HealthCheckResult,
    NodeDrained,
    NodeReturned,
    RunEnded,
    RunStarted,
)
from trainguard.core.rundir import RunDir
from trainguard.health.fleetdb import FleetDB

JOBS, HOSTS, ROUNDS = 3, 3, 6
HOST_NAMES = tuple(f"h{i}" for i in range(HOSTS))
"""Every job runs on these hosts (as jobs share a fleet): each host's history comes from several jobs."""
T0 = 1_780_000_000.0
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."


def _job_dir(root: Path, job: int) -> RunDir:
    """A job's run folder, its start written by the head agent before the hosts' agents begin."""
    rd = RunDir(root / f"job-{job}").create()
    with rd.writer("agent-head") as w:
        w.write(RunStarted(time=T0 + job * 1000, host="head", run_id=f"job-{job}", world_size=HOSTS, nnodes=HOSTS))
    return rd


def _round(job: int, host: str, k: int, hosts: tuple[str, ...] | None = None) -> list[Any]:
    """What one host's agent records in round ``k``: an attempt of the job's ``hosts`` that failed on it, a
    diagnosis naming it with an XID, a failed check, a drain and a return (every kind of host history)."""
    t = T0 + job * 1000 + k * 10
    return [
        AttemptStarted(time=t, host=host, attempt=k, hosts=hosts or (host,)),
        FailureDetected(time=t + 1, host=host, attempt=k, kind="crash", hosts=(host,)),
        Diagnosis(time=t + 2, host=host, attempt=k, category="Faulty GPU", group="GPU", culprit_hosts=(host,),
                  confidence=0.9, evidence=(XID,)),
        HealthCheckResult(time=t + 3, host=host, name="gpu_ecc", severity="high", ok=False, attempt=k),
        AttemptEnded(time=t + 4, host=host, attempt=k, reason="failure"),
        NodeDrained(time=t + 5, host=host, node=host, status="drained", reason=f"round {k}", scheduler="slurm"),
        NodeReturned(time=t + 6, host=host, node=host, scheduler="slurm", drained_reason=f"round {k}"),
    ]


def _agent(db: str, root: str, job: int, host: str, barrier: Any) -> None:
    """One host's agent of one job: append a round, index its job's run, and (a shared file system) another
    job's run too; everything at once with the other agents."""
    rd = RunDir(Path(root) / f"job-{job}")
    other = Path(root) / f"job-{(job + 1) % JOBS}"
    barrier.wait()
    with FleetDB(db) as fleet:
        for k in range(ROUNDS):
            with rd.writer(f"agent-{host}") as w:
                w.write_all(_round(job, host, k, HOST_NAMES))
            fleet.index(rd)
            fleet.index(other)
        if host == "h0":
            with rd.writer("agent-head") as w:
                w.write(RunEnded(time=T0 + job * 1000 + 999, host="head", run_id=f"job-{job}", status="completed"))
            fleet.index(rd)


def _state(db: str) -> dict[str, Any]:
    with FleetDB(db) as fleet:
        return {"runs": [(r.uid, r.run_id, r.status, r.events) for r in fleet.runs()],
                "events": fleet.event_count(), "history": fleet.host_history(), "hosts": fleet.hosts()}


def test_many_writers_from_several_jobs_and_hosts_lose_and_duplicate_nothing(tmp_path: Path, fleet_db: str) -> None:
    root = tmp_path / "runs"
    for j in range(JOBS):
        _job_dir(root, j)
    ctx = mp.get_context("spawn")
    agents = [(j, h) for j in range(JOBS) for h in HOST_NAMES]
    barrier = ctx.Barrier(len(agents), timeout=240)
    procs = [ctx.Process(target=_agent, args=(fleet_db, str(root), j, h, barrier)) for j, h in agents]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    got = _state(fleet_db)
    # the reference: the finished runs indexed one after the other into a fresh file
    reference = str(tmp_path / "reference.db")
    with FleetDB(reference) as ref:
        for j in range(JOBS):
            ref.index(root / f"job-{j}")
    want = _state(reference)
    lines = sum(len(p.read_text().splitlines()) for j in range(JOBS) for p in RunDir(root / f"job-{j}").event_files())
    assert want["events"] == lines == JOBS * (1 + HOSTS * ROUNDS * 7 + 1)
    assert got == want
    # each agent's rounds: failure, culprit, xid, check, drained, returned, and each failed attempt's members
    assert len(got["history"]) == JOBS * ROUNDS * HOSTS * (6 + HOSTS)
    assert got["hosts"] == list(HOST_NAMES)
    with FleetDB(fleet_db) as fleet:
        assert [r.status for r in fleet.runs()] == ["completed"] * JOBS


def _history_runs(root: Path) -> list[Path]:
    """Runs whose history covers every verb's view: a lemon, a host drained again after its return, links."""
    from tests.unit import linklogs as L
    from trainguard.classify import classify_paths

    out = []
    for job in range(2):
        rd = _job_dir(root, job)
        with rd.writer("agent-h1") as w:
            w.write_all(_round(job, "h1", 0))
        with rd.writer("agent-h2") as w:
            w.write(HealthCheckResult(time=T0 + job * 1000 + 50, host="h2", name="clock_sync", severity="low",
                                      ok=False))
        out.append(rd.root)
    (root.parent / "logs").mkdir()
    paths = L.write(root.parent / "logs", L.broken_hca(4, 2, 0), 4)
    (c,) = classify_paths(paths, combine=True)
    assert c.links is not None
    rd = RunDir(root / "links").create()
    with rd.writer("agent-node-00") as w:
        w.write_all([RunStarted(time=T0 + 5000, host="node-00", run_id="links", world_size=4),
                     Diagnosis(time=T0 + 5005, host="node-00", attempt=0, category="Network Switch/Cable",
                               group="Network", culprit_hosts=("node-02",), evidence=c.links.evidence_strings())])
    out.append(rd.root)
    return out


def _verbs(db: str, capsys: pytest.CaptureFixture[str]) -> list[tuple[int, str]]:
    out = []
    for extra in ([], ["--json"], ["--json", "--drained"], ["--json", "--flagged"], ["--links"], ["--links", "--json"]):
        code = main(["hosts", "--db", db, "--half-life-days", "0", *extra])  # no decay: no clock in the answer
        out.append((code, capsys.readouterr().out))
    return out


def test_hosts_and_the_dashboard_read_the_same_answers_on_both_engines(
        tmp_path: Path, postgres_server: PostgresServer, capsys: pytest.CaptureFixture[str]) -> None:
    from trainguard.web.catalog import Catalog

    runs = _history_runs(tmp_path / "runs")
    file_db = str(tmp_path / "fleet.db")
    server_db = postgres_server.url(postgres_server.new_database())
    for db in (file_db, server_db):
        with FleetDB(db) as fleet:
            for rd in runs:
                fleet.index(rd)
    on_file, on_server = _verbs(file_db, capsys), _verbs(server_db, capsys)
    assert on_file == on_server
    assert all(code == 0 for code, _ in on_file)
    docs = json.loads(on_file[1][1])
    assert docs[0]["host"] == "h1" and docs[0]["flagged"] and docs[0]["drains"]["returned"] == 2
    assert "mlx5_0:1 -> node-01" in on_file[4][1]
    # the dashboard's run list: the same runs, ids and order from either database
    listed = [Catalog([], db).entries() for db in (file_db, server_db)]
    assert listed[0] == listed[1] and [e.path for e in listed[0]] == runs
    assert all(e.source == "db" for e in listed[0])


def test_a_run_moved_after_indexing_reads_the_same_on_both_engines(tmp_path: Path, fleet_db: str) -> None:
    """Re-indexing from the new place updates the path the dashboard lists, and adds nothing."""
    from trainguard.web.catalog import Catalog

    (rd,) = _history_runs(tmp_path / "runs")[:1]
    with FleetDB(fleet_db) as fleet:
        first = fleet.index(rd)
        moved = tmp_path / "archive" / "job-0"
        shutil.move(str(rd), moved)
        again = fleet.index(moved)
    assert again.uid == first.uid and again.new_events == 0
    assert [e.path for e in Catalog([], fleet_db).entries()] == [moved.resolve()]
