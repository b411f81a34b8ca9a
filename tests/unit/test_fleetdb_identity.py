"""Fleet database identity and robustness: runs are known by content, not folder name (on both engines); bad
records, bad database files and failing writes give the documented errors."""

from __future__ import annotations

import json
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.streams import crash_mid_step
from trainguard.core.events import RunEnded, RunStarted
from trainguard.core.rundir import RunDir
from trainguard.errors import InputError, StorageError
from trainguard.health.fleetdb import LEGACY_PREFIX, FleetDB, FleetDBError


def _write(root: Path, case, *, start_shift: float = 0.0, host: str | None = None,
           drop_run_started: bool = False) -> RunDir:
    rd = RunDir(root).create()
    for writer, records in case.writers.items():
        out = []
        for r in records:
            if isinstance(r, RunStarted):
                if drop_run_started:
                    continue
                r = replace(r, time=r.time + start_shift, host=host or r.host)
            out.append(r)
        with rd.writer(writer) as w:
            w.write_all(out)
    return rd


def _lines(rd: RunDir) -> int:
    return sum(len(p.read_text().splitlines()) for p in rd.event_files())


def test_two_runs_with_the_same_folder_name_are_both_indexed(tmp_path: Path, fleet_db: str) -> None:
    # the same job script run on two clusters: same folder name, same run_id, different start
    a = _write(tmp_path / "runs" / "ok", crash_mid_step())
    b = _write(tmp_path / "clusterC" / "ok", crash_mid_step(), start_shift=3600.0, host="c-h0")
    with FleetDB(fleet_db) as db:
        ra, rb = db.index(a), db.index(b)
        assert ra.uid != rb.uid and ra.run_id == rb.run_id == "crash"
        assert rb.new_events == _lines(b) > 0
        assert len(db.runs()) == 2
        assert db.event_count() == _lines(a) + _lines(b)
        # both runs' host history is kept, under distinct keys
        culprits = {h.run_id for h in db.host_history("h0") if h.kind == "culprit"}
        assert culprits == {ra.uid, rb.uid}


def test_the_same_run_from_a_copied_path_is_not_duplicated(tmp_path: Path, fleet_db: str) -> None:
    a = _write(tmp_path / "runs" / "ok", crash_mid_step())
    copy = tmp_path / "archive" / "renamed"
    shutil.copytree(a.root, copy)
    with FleetDB(fleet_db) as db:
        first = db.index(a)
        again = db.index(copy)
        assert again.uid == first.uid and again.new_events == 0
        (run,) = db.runs()
        assert run.path == str(copy.resolve()) and run.name == "renamed"
        assert db.event_count() == _lines(a)


def test_runs_without_run_started_are_told_apart_by_content(tmp_path: Path, fleet_db: str) -> None:
    a = _write(tmp_path / "x" / "same", crash_mid_step(), drop_run_started=True)
    b_case = crash_mid_step()
    for records in b_case.writers.values():  # the same job started a minute earlier
        records[:] = [replace(r, time=r.time - 60) for r in records]
    b = _write(tmp_path / "y" / "same", b_case, drop_run_started=True)
    with FleetDB(fleet_db) as db:
        ra, rb = db.index(a), db.index(b)
        assert ra.run_id is None and ra.uid.startswith("anon@") and ra.uid != rb.uid
        # appending to a run keeps its identity
        with a.writer("agent-h0") as w:
            w.write(RunEnded(time=2e9, host="h0", run_id="late", status="failed"))
        again = db.index(a)
        assert again.uid == ra.uid and again.new_events == 1
        assert len(db.runs()) == 2


def test_growing_run_keeps_its_identity(tmp_path: Path, fleet_db: str) -> None:
    a = _write(tmp_path / "r", crash_mid_step())
    with FleetDB(fleet_db) as db:
        first = db.index(a)
        with a.writer("rank-9") as w:
            w.write(RunEnded(time=1.0, host="z", run_id="crash", status="failed"))
        assert db.index(a).uid == first.uid


def _record_line(**fields: object) -> str:
    return json.dumps({"v": 1, **fields}) + "\n"


@pytest.mark.parametrize("bad", [
    {"type": "attempt_started", "time": 5.0, "host": "h", "attempt": [1], "hosts": ["h"]},
    {"type": "failure_detected", "time": 5.0, "host": {"a": 1}, "attempt": 0, "kind": "crash", "hosts": ["h"]},
    {"type": "diagnosis", "time": 5.0, "host": "h", "attempt": 0, "category": "X", "culprit_hosts": "h0"},
    {"type": "node_excluded", "time": 5.0, "host": "h", "node": ["h"], "reason": "x"},
    {"type": "step_completed", "time": 1e300, "host": "h", "attempt": 0, "rank": 0, "step": "7"},
    {"type": "run_started", "time": 5.0, "host": "h\ud800", "run_id": "x\ud800"},
])
def test_wrong_typed_records_never_break_the_index(tmp_path: Path, bad: dict[str, object], fleet_db: str) -> None:
    rd = _write(tmp_path / "r", crash_mid_step())
    with (rd.events_dir / "agent-bad.jsonl").open("w") as f:
        f.write(_record_line(type="run_ended", time=1.0, host="h", run_id="r", status="failed"))
        f.write(json.dumps({"v": 1, **bad}) + "\n")
    with FleetDB(fleet_db) as db:
        try:
            r = db.index(rd)
        except InputError:
            return  # a stricter reader may refuse the file: also fine, as long as it is an InputError
        assert r.new_events >= _lines(rd) - 1 - r.skipped
        assert db.event_count() == r.events


def test_garbage_database_file_is_an_input_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(FleetDBError, match="not a usable fleet database"):
        FleetDB(junk)
    with pytest.raises(FleetDBError, match="is a directory"):
        FleetDB(tmp_path)


def test_full_database_is_a_storage_error(tmp_path: Path) -> None:
    rd = _write(tmp_path / "r", crash_mid_step())
    with FleetDB(tmp_path / "fleet.db") as db:
        # SQLite's own size cap fails writes exactly like a full disk (SQLITE_FULL)
        pages = db._conn.execute("PRAGMA page_count").fetchone()[0]
        db._conn.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(StorageError, match=r"cannot (write|commit to) the fleet database"):
            db.index(rd)
        db._conn.execute("PRAGMA max_page_count = 1000000")
        assert db.index(rd).new_events == _lines(rd)  # nothing half-written was left behind


def test_first_layout_database_is_upgraded_and_replaced_on_reindex(tmp_path: Path) -> None:
    rd = _write(tmp_path / "run-a", crash_mid_step())
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, path TEXT NOT NULL, started REAL, ended REAL, status TEXT,"
        " synthetic INTEGER NOT NULL DEFAULT 0, indexed_at REAL NOT NULL);"
        "CREATE TABLE events (run_id TEXT NOT NULL, writer TEXT NOT NULL, line INTEGER NOT NULL, type TEXT NOT NULL,"
        " time REAL NOT NULL, host TEXT NOT NULL, body TEXT NOT NULL, PRIMARY KEY (run_id, writer, line));"
        "CREATE INDEX events_by_type ON events (type, run_id);"
        "CREATE TABLE host_history (host TEXT NOT NULL, run_id TEXT NOT NULL, time REAL NOT NULL, kind TEXT NOT NULL,"
        " detail TEXT NOT NULL, source_writer TEXT NOT NULL, source_line INTEGER NOT NULL,"
        " PRIMARY KEY (host, run_id, source_writer, source_line, kind, detail));")
    old.execute("INSERT INTO runs VALUES ('run-a', ?, 1, 2, 'completed', 0, 3)", (str(rd.root.resolve()),))
    old.execute("INSERT INTO events VALUES ('run-a', 'rank-0', 1, 'step_completed', 1, 'h0', '{}')")
    old.execute("INSERT INTO host_history VALUES ('h0', 'run-a', 1, 'culprit', 'Faulty GPU', 'agent-h0', 3)")
    old.execute("INSERT INTO runs VALUES ('gone', '/nowhere/gone', 1, 2, 'failed', 0, 3)")
    old.commit()
    old.close()
    with FleetDB(path) as db:
        assert {r.uid for r in db.runs()} == {LEGACY_PREFIX + "run-a", LEGACY_PREFIX + "gone"}
        assert len(db.host_history("h0")) == 1
        new = db.index(rd)
        assert {r.uid for r in db.runs()} == {new.uid, LEGACY_PREFIX + "gone"}
        assert db.event_count() == _lines(rd)
        assert all(h.run_id == new.uid for h in db.host_history())
