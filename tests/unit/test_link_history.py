"""Link-level history: the agent's diagnosis carries the failing pairs, the fleet database counts them per run."""

from __future__ import annotations

import random
from pathlib import Path

from tests.unit import linklogs as L
from trainguard.classify import classify_paths, parse_link_evidence
from trainguard.core.events import Diagnosis, RunEnded, RunStarted
from trainguard.core.rundir import RunDir
from trainguard.health.fleetdb import FleetDB
from trainguard.health.lemon import rank_hosts
from trainguard.health.link_history import summarize
from trainguard.launch import failures
from trainguard.launch.evidence import GatheredEvidence


def _evidence(tmp: Path, logs: dict[int, list[str]], n: int) -> tuple[str, ...]:
    tmp.mkdir()
    paths = L.write(tmp, logs, n)
    (c,) = classify_paths(paths, combine=True)
    assert c.links is not None
    return c.links.evidence_strings()


def _run(root: Path, name: str, evidence: tuple[str, ...], t: float) -> RunDir:
    rd = RunDir(root / name).create()
    with rd.writer("agent-node-00") as w:
        w.write_all([RunStarted(time=t, host="node-00", run_id=name, world_size=8),
                     Diagnosis(time=t + 5, host="node-00", attempt=0, category="Network Switch/Cable",
                               group="Network", culprit_ranks=(3,), culprit_hosts=("node-03",), confidence=0.7,
                               evidence=("some.log:3: NCCL WARN ...", *evidence)),
                     RunEnded(time=t + 9, host="node-00", run_id=name, status="failed")])
    return rd


def test_evidence_lines_round_trip() -> None:
    assert parse_link_evidence("link-pair: node-03 mlx5_3:1 -> node-04: 2 failing, 1 transient line(s)") == (
        "node-03", "mlx5_3:1 -> node-04", 2, 1)
    assert parse_link_evidence("link-pair: ? - -> 10.0.0.9: 1 failing, 0 transient line(s)") is None
    assert parse_link_evidence("node-03 NCCL WARN NET/IB") is None


def test_fleet_db_counts_links_across_runs_and_flags_a_flapping_one(tmp_path: Path, fleet_db: str) -> None:
    n = 8
    # two runs in which node-02 retried its connection to node-05 (a job that survived), then one that failed
    flaps = [_evidence(tmp_path / f"f{k}", {2: [L.retry(2, 5), L.retry(2, 5)]}, n) for k in range(2)]
    failed = _evidence(tmp_path / "x", L.broken_hca(n, 3, 1), n)
    runs = [_run(tmp_path, f"run-{k}", ev, 1000.0 * (k + 1)) for k, ev in enumerate([*flaps, failed])]
    with FleetDB(fleet_db) as db:
        for rd in runs:
            db.index_run(rd)
        db.index_run(runs[0])  # indexing again adds nothing
        history = summarize(db.link_history())
        scores = {s.host: s.score for s in rank_hosts(db)}
    by = {(h.host, h.link): h for h in history}
    flap = by[("node-02", "- -> node-05")]
    assert len(flap.flapped_runs) == 2 and not flap.failed_runs and flap.flapping
    broken = by[("node-03", "mlx5_1:1 -> node-02")]
    assert len(broken.failed_runs) == 1 and not broken.flapping
    assert ("node-04", "mlx5_1 -> node-03") in by  # the peer's side of the broken link
    assert history[0].failed_runs  # failing links first
    assert scores.get("node-02", 0.0) == 0.0  # link history alone is not lemon evidence


def test_agent_diagnosis_names_the_shared_link_from_every_rank_tail(tmp_path: Path) -> None:
    n = 4
    logs = L.merge(L.broken_hca(n, 1, 2), L.noise(n, random.Random(3), 1))
    for i, p in enumerate(L.write(tmp_path, logs, n)):
        p.rename(tmp_path / f"log_tail_rank_{i}.txt")
    ev = GatheredEvidence(directory=tmp_path)
    found = failures.classify(ev, [1], "crash", "nccl", 0)
    assert "link: hca node-01 mlx5_2:1" in found.note
    assert any(line.startswith("link-shared: hca node-01 mlx5_2:1") for line in found.lines)
    assert sum(line.startswith("link-pair: ") for line in found.lines) >= 3
    assert found.category == "Network Switch/Cable"
