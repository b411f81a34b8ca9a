"""Fleet database: indexing is idempotent, concurrent indexers neither lose nor duplicate events (on SQLite and on
a real PostgreSQL server: the ``fleet_db`` fixture runs each test once per engine)."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import threading
import time
import types
from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.streams import crash_mid_step, skewed_hosts
from trainguard.core.events import RunEnded, RunStarted
from trainguard.core.rundir import RunDir
from trainguard.errors import InputError
from trainguard.health.fleetdb import FleetDB, sqlite_backend


def _make_run(root: Path, name: str, case, *, own_id: bool = False) -> RunDir:
    """A run directory holding ``case``; with ``own_id`` its run_id is the folder name (a distinct run,
    where copies of one case would otherwise be one run copied to several folders)."""
    rd = RunDir(root / name).create()
    for writer, records in case.writers.items():
        if own_id:
            records = [replace(r, run_id=name) if isinstance(r, (RunStarted, RunEnded)) else r for r in records]
        with rd.writer(writer) as w:
            w.write_all(records)
    return rd


def _count_lines(rd: RunDir) -> int:
    return sum(len(p.read_text().splitlines()) for p in rd.event_files())


def test_index_is_idempotent_and_builds_host_history(tmp_path: Path, fleet_db: str) -> None:
    rd = _make_run(tmp_path, "run-a", crash_mid_step())
    with FleetDB(fleet_db) as db:
        assert db.index_run(rd) == _count_lines(rd)
        assert db.index_run(rd) == 0
        assert db.event_count("run-a") == _count_lines(rd)
        kinds = {(h.host, h.kind, h.detail) for h in db.host_history()}
        assert ("h0", "culprit", "Faulty GPU") in kinds
        assert ("h0", "xid", "79") in kinds
        assert ("h0", "failure", "crash") in kinds
        assert ("h0", "failed_attempt_member", "attempt 0") in kinds
        (run,) = db.runs()
        assert run.status == "completed" and run.events == _count_lines(rd)
    if db.engine == "sqlite":
        mode = sqlite3.connect(fleet_db).execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"


def test_a_read_older_than_the_stored_one_does_not_take_the_end_back(
        tmp_path: Path, fleet_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two indexers of a growing run: one read the folder before the run's end was written and commits after
    the other indexed the end. The run stays ended (it was "running" again in a loaded CI run)."""
    from trainguard.health.fleetdb import store

    rd = RunDir(tmp_path / "job").create()
    with rd.writer("agent-head") as w:
        w.write(RunStarted(time=100.0, host="head", run_id="job", world_size=1))
    stale = store.read_run(rd)
    with rd.writer("agent-head") as w:
        w.write(RunEnded(time=200.0, host="head", run_id="job", status="completed"))
    with FleetDB(fleet_db) as db:
        db.index(rd)
        monkeypatch.setattr(store, "read_run", lambda _rd: stale)
        assert db.index(rd).new_events == 0
        (run,) = db.runs()
        assert (run.status, run.ended, run.events) == ("completed", 200.0, 2)


def _index_many(db_path: str, runs: list[str], rounds: int) -> None:
    with FleetDB(db_path) as db:
        for _ in range(rounds):
            for r in runs:
                db.index_run(r)


def test_concurrent_indexers_lose_and_duplicate_nothing(tmp_path: Path, fleet_db: str) -> None:
    runs = [_make_run(tmp_path, f"run-{i}", (crash_mid_step if i % 2 else skewed_hosts)(), own_id=True)
            for i in range(6)]
    expected = sum(_count_lines(r) for r in runs)
    db_path = fleet_db
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_index_many, args=(db_path, [str(r.root) for r in runs[i:] + runs[:i]], 3))
             for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with FleetDB(db_path) as db:
        assert db.event_count() == expected
        assert len(db.runs()) == 6


def test_a_missing_run_is_an_input_error(tmp_path: Path, fleet_db: str) -> None:
    with FleetDB(fleet_db) as db:
        with pytest.raises(InputError, match="no such run directory"):
            db.index_run(tmp_path / "missing")
        assert db.runs() == []


def test_bad_db_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InputError, match="not a usable fleet database"):
        FleetDB(junk)


def test_host_history_filters_by_host(fleet_db: str) -> None:
    from trainguard.samples import SAMPLE_RUN

    with FleetDB(fleet_db) as db:
        db.index_run(SAMPLE_RUN)
        assert db.hosts() == ["node-a", "node-b"]
        b = db.host_history("node-b")
        assert b and {h.host for h in b} == {"node-b"}
        assert ("culprit", "GPU HBM3 Memory") in {(h.kind, h.detail) for h in b}
        assert ("xid", "48") in {(h.kind, h.detail) for h in b}


def test_a_file_another_connection_writes_to_turns_to_wal_once_it_is_free(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # SQLite calls no busy handler for the WAL switch: while a writer held the file, the open failed at once with
    # "database is locked" (a CI run's many writers opening one new file). Now it waits, within the busy timeout.
    path = tmp_path / "fleet.db"
    seed = sqlite3.connect(path)
    seed.execute("CREATE TABLE t(x)")
    seed.commit()
    seed.close()
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")  # a rollback-journal file with a writer in it
    retried = threading.Event()

    def pause(seconds: float) -> None:
        retried.set()
        time.sleep(seconds)

    monkeypatch.setattr(sqlite_backend, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=pause))
    outcome: list[object] = []

    def open_it() -> None:
        try:
            with FleetDB(path, busy_timeout_seconds=120.0) as fleet:
                outcome.append(fleet.event_count())
        except Exception as exc:  # the failure before the fix
            outcome.append(exc)

    opener = threading.Thread(target=open_it)
    opener.start()
    while not retried.is_set() and opener.is_alive():  # until it found the file held and waits
        time.sleep(0.01)
    writer.execute("COMMIT")
    writer.close()
    opener.join(120)
    assert outcome == [0]
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
