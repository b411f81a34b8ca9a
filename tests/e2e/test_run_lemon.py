"""The supervisor keeps a host that the fleet history flags as a lemon out of the job."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e._run_helpers import TINY, TRAIN_GPT, events, of_type, trainguard
from trainguard.core.events import Diagnosis, RunEnded, RunStarted
from trainguard.core.rundir import RunDir
from trainguard.health.fleetdb import FleetDB
from trainguard.health.lemon import flagged_hosts


def _history(db_path: str, tmp_path: Path, host: str, incidents: int) -> None:
    """Past runs in which ``host`` was named the culprit ``incidents`` times."""
    with FleetDB(db_path) as db:
        for i in range(incidents):
            rd = RunDir(tmp_path / f"past-{i}").create()
            with rd.writer("agent") as w:
                t = time.time() - (i + 1) * 3600  # recent: lemon scores decay with age
                w.write(RunStarted(time=t, host="head", run_id=f"past-{i}"))
                w.write(Diagnosis(time=t + 60, host="head", attempt=0, category="Faulty GPU", group="GPU",
                                  culprit_ranks=(3,), culprit_hosts=(host,), confidence=0.9))
                w.write(RunEnded(time=t + 120, host="head", run_id=f"past-{i}", status="completed"))
            db.index_run(rd)


def test_flagged_host_is_excluded_before_it_starts_any_rank(tmp_path: Path, fleet_db: str) -> None:
    """On either engine, named by --fleet-db (a file or a postgresql:// URL)."""
    _history(fleet_db, tmp_path, "lemon-1", incidents=3)
    with FleetDB(fleet_db) as db:
        assert flagged_hosts(db) == {"lemon-1"}
    run_dir = tmp_path / "run"
    res = trainguard("run", "--nproc-per-node", "1", "--node-id", "lemon-1", "--run-dir", str(run_dir),
                     "--fleet-db", fleet_db, "--", str(TRAIN_GPT), "--steps", "3", *TINY,
                     env={"TRAINGUARD_DB": str(tmp_path / "not-this-one.db")}, timeout=120)
    assert res.returncode == 5, res.stderr
    (excluded,) = of_type(events(run_dir), "node_excluded")
    assert excluded["node"] == "lemon-1" and "lemon" in excluded["reason"]
    assert of_type(events(run_dir), "step_completed") == []
    assert not (tmp_path / "not-this-one.db").exists()


def test_no_fleet_database_means_no_lemon_check_and_none_is_created(tmp_path: Path) -> None:
    db_path = tmp_path / "absent" / "fleet.db"
    run_dir = tmp_path / "run"
    res = trainguard("run", "--nproc-per-node", "1", "--node-id", "fresh-node", "--run-dir", str(run_dir),
                     "--", str(TRAIN_GPT), "--steps", "3", *TINY,
                     env={"TRAINGUARD_DB": str(db_path)}, timeout=120)
    assert res.returncode == 0, res.stderr
    assert not db_path.exists()
    assert len({r["step"] for r in of_type(events(run_dir), "step_completed")}) == 3
