"""Two simulated trials written to folders of the same name are two runs, and ``index`` never drops the events
of a different run that shares another's key.

The break it reproduces: ``simulate --seed 1 --events a/job`` and ``--seed 2 --events b/job`` wrote the same
``run_started`` (run id = folder name, the same start instant and host), so ``index`` keyed them as one run
and reported "0 new events" for the second: its events were silently dropped.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.e2e.cli import trainguard


def _simulate(where: Path, seed: int) -> None:
    r = trainguard("simulate", "--gpus", "1024", "--days", "3", "--trials", "5", "--seed", str(seed),
                   "--events", str(where))
    assert r.code == 0, r.err


def _run_started(where: Path) -> dict[str, object]:
    for path in sorted((where / "events").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["type"] == "run_started":
                return dict(record)
    raise AssertionError("no run_started")


def test_two_simulated_trials_in_folders_of_one_name_are_two_runs(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "job", tmp_path / "b" / "job"
    _simulate(a, 1)
    _simulate(b, 2)
    ra, rb = _run_started(a), _run_started(b)
    assert ra["run_id"] == "job-seed1" and rb["run_id"] == "job-seed2"
    assert ra["config"]["seed"] == 1 and rb["config"]["seed"] == 2  # type: ignore[index]
    r = trainguard("index", str(a), str(b), "--db", str(tmp_path / "f.db"), "--json")
    assert r.code == 0, r.err
    runs = json.loads(r.out)["runs"]
    assert runs[0]["uid"] != runs[1]["uid"]
    assert runs[0]["new_events"] > 0 and runs[1]["new_events"] > 0


def test_a_different_run_under_a_shared_key_is_refused_not_dropped(tmp_path: Path, fleet_db: str) -> None:
    a, b = tmp_path / "a" / "job", tmp_path / "b" / "job"
    _simulate(a, 1)
    _simulate(b, 2)
    # make b's start the same as a's (what two runs that share an id, start and host look like)
    rs = json.dumps(_run_started(a), separators=(",", ":"))
    for path in (b / "events").glob("*.jsonl"):
        lines = path.read_text().splitlines()
        lines = [rs if json.loads(line)["type"] == "run_started" else line for line in lines]
        path.write_text("\n".join(lines) + "\n")
    db = fleet_db
    r = trainguard("index", str(a), str(b), "--db", str(db), "--json")
    assert r.code == 3, r.err
    assert "share one key" in r.err and "Traceback" not in r.err
    doc = json.loads(r.out)
    assert [x["ok"] for x in doc["runs"]] == [True, False]
    total = doc["total_events"]
    # the same run copied elsewhere is the same run: indexed again, nothing new, no complaint
    copy = tmp_path / "copy" / "job"
    shutil.copytree(a, copy)
    again = trainguard("index", str(copy), "--db", str(db), "--json")
    assert again.code == 0, again.err
    assert json.loads(again.out)["runs"][0]["new_events"] == 0 and json.loads(again.out)["total_events"] == total
