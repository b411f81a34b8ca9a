"""Link localization as a user runs it: ``classify --topology --json``, a bad topology file, ``hosts --links``."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.cli import assert_one_line_error, trainguard
from tests.unit import linklogs as L
from trainguard.classify import classify_paths
from trainguard.core.events import Diagnosis, RunStarted
from trainguard.core.rundir import RunDir
from trainguard.health.fleetdb import FleetDB


def test_classify_names_a_broken_leaf_switch_with_the_topology_file(tmp_path: Path) -> None:
    n = 16
    paths = L.write(tmp_path, L.broken_leaf(n, [4, 5, 6, 7]), n)
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(L.topology(n, 4)))
    r = trainguard("classify", "--json", "--combine", "--topology", str(topo), *map(str, paths))
    assert r.code == 0, r.err
    (doc,) = json.loads(r.out)
    links = doc["links"]
    assert links["shared"]["kind"] == "leaf" and links["shared"]["leaf"] == "leaf-1"
    assert links["topology"] is True and links["fatal_pairs"] == len([p for p in links["pairs"] if p["fatal"]])
    r = trainguard("classify", "--combine", "--topology", str(topo), *map(str, paths))
    assert "link: leaf leaf-1" in r.out
    r = trainguard("classify", "--combine", *map(str, paths))
    assert "link: no common element" in r.out


def test_bad_topology_file_is_one_line_and_exit_3(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("step 1\n")
    bad = tmp_path / "t.json"
    bad.write_text('{"hosts": {"a": {"leaf": ""}}}')
    for path in (bad, tmp_path / "missing.json"):
        r = trainguard("classify", "--topology", str(path), str(log))
        assert_one_line_error(r, 3)
        assert "topology" in r.err


def test_hosts_links_lists_link_history(tmp_path: Path, fleet_db: str) -> None:
    n = 4
    paths = L.write(tmp_path, L.broken_hca(n, 2, 0), n)
    (c,) = classify_paths(paths, combine=True)
    assert c.links is not None
    rd = RunDir(tmp_path / "run").create()
    with rd.writer("agent-node-00") as w:
        w.write_all([RunStarted(time=1000.0, host="node-00", run_id="r1", world_size=4),
                     Diagnosis(time=1005.0, host="node-00", attempt=0, category="Network Switch/Cable",
                               group="Network", culprit_hosts=("node-02",), evidence=c.links.evidence_strings())])
    db = fleet_db
    with FleetDB(db) as fleet:
        fleet.index_run(rd)
    r = trainguard("hosts", "--links", "--json", "--db", str(db))
    assert r.code == 0, r.err
    rows = json.loads(r.out)
    assert {"host": "node-02", "link": "mlx5_0:1 -> node-01", "failed_runs": 1, "flapped_runs": 0,
            "flapping": False, "last_seen": 1005.0} in rows
    r = trainguard("hosts", "--links", "--db", str(db))
    assert r.code == 0 and "mlx5_0:1 -> node-03" in r.out
