"""``trainguard index`` on bad runs, bad database files, a read-only database and a full disk."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cli import assert_one_line_error, trainguard
from trainguard.samples import SAMPLE_RUN


def _bad_run(root: Path) -> Path:
    (root / "events").mkdir(parents=True)
    (root / "events" / "agent-x.jsonl").write_text('{"v": 1, "type": "run_started"\n{"v": 1}\n')
    return root


def test_a_bad_run_does_not_stop_the_good_ones(tmp_path: Path, fleet_db: str) -> None:
    bad = _bad_run(tmp_path / "A_bad")
    r = trainguard("index", str(bad), str(SAMPLE_RUN), "--db", fleet_db, "--json")
    assert r.code == 3, r.err
    assert "Traceback" not in r.err and "A_bad" in r.err and "warning" in r.err
    data = json.loads(r.out)
    assert [x["ok"] for x in data["runs"]] == [False, True]
    assert data["runs"][1]["new_events"] == data["total_events"] > 0


def test_same_folder_name_two_runs_both_indexed(tmp_path: Path, fleet_db: str) -> None:
    from dataclasses import replace

    from trainguard.core.events import RunStarted
    from trainguard.core.rundir import RunDir

    a = tmp_path / "runs" / "ok"
    shutil.copytree(SAMPLE_RUN, a)
    b = RunDir(tmp_path / "clusterC" / "ok").create()
    for path in RunDir(SAMPLE_RUN).event_files():
        from trainguard.core.eventlog import read_events

        records = [replace(e, time=e.time + 86400) if isinstance(e, RunStarted) else e for e in read_events(path)]
        with b.writer(path.stem) as w:
            w.write_all(records)
    first = json.loads(trainguard("index", str(a), "--db", fleet_db, "--json").out)
    second = trainguard("index", str(b.root), "--db", fleet_db, "--json")
    assert second.code == 0, second.err
    data = json.loads(second.out)
    assert data["runs"][0]["new_events"] == first["total_events"] > 0
    assert data["total_events"] == 2 * first["total_events"]
    assert data["runs"][0]["uid"] != first["runs"][0]["uid"]


@pytest.mark.parametrize("record", [
    {"type": "step_completed", "time": 5.0, "host": "h", "attempt": 0, "rank": 0, "step": "seven"},
    {"type": "attempt_started", "time": 5.0, "host": "h", "attempt": [1], "hosts": ["h"]},
    {"type": "failure_detected", "time": 5.0, "host": {"a": 1}, "attempt": 0, "kind": "crash"},
    {"type": "diagnosis", "time": 5.0, "host": "h", "attempt": {}, "category": 3, "culprit_hosts": [{}]},
])
def test_wrong_typed_events_are_never_an_internal_error(tmp_path: Path, record: dict[str, object]) -> None:
    run = tmp_path / "r"
    shutil.copytree(SAMPLE_RUN, run)
    with (run / "events" / "agent-node-a.jsonl").open("a") as f:
        f.write(json.dumps({"v": 1, **record}) + "\n")
    r = trainguard("index", str(run), "--db", str(tmp_path / "f.db"))
    assert r.code in (0, 3), r.err
    assert "Traceback" not in r.err and "internal error" not in r.err


def test_garbage_database_file_exits_3(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"\x00\x01garbage" * 500)
    assert_one_line_error(trainguard("index", str(SAMPLE_RUN), "--db", str(junk)), 3)
    assert_one_line_error(trainguard("hosts", "--db", str(junk)), 3)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(writable folder, the same folder seen read-only). As root, permission bits are not enforced,
    so the folder is bind-mounted read-only; skipped where that is not permitted either."""
    src = tmp_path / "data"
    src.mkdir()
    if os.geteuid() != 0:
        yield src, src
        for p in src.iterdir():
            p.chmod(0o644)
        src.chmod(0o755)
        return
    ro = tmp_path / "ro"
    ro.mkdir()
    ok = subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True).returncode == 0
    ok = ok and subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode == 0
    if not ok:
        subprocess.run(["umount", str(ro)], capture_output=True)
        pytest.skip("running as root without permission to bind-mount read-only: no way to make a read-only file")
    try:
        yield src, ro
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_read_only_database_exits_4(tmp_path: Path, read_only_dir: tuple[Path, Path]) -> None:
    src, ro = read_only_dir
    r = trainguard("index", str(SAMPLE_RUN), "--db", str(src / "fleet.db"))
    assert r.code == 0, r.err
    # a clean close leaves no -wal/-shm files: the read-only copy is a plain SQLite file
    (src / "fleet.db").chmod(0o444)
    src.chmod(0o555)
    other = tmp_path / "other"
    shutil.copytree(SAMPLE_RUN, other)
    with (other / "events" / "agent-node-a.jsonl").open("a") as f:  # something new to write
        f.write('{"v":1,"type":"run_ended","time":1,"host":"x","run_id":"y","status":"failed"}\n')
    assert_one_line_error(trainguard("index", str(other), "--db", str(ro / "fleet.db")), 4)


def _limit_file_size() -> None:
    # a file-size limit makes writes past it fail with EFBIG, as a full disk fails them with ENOSPC
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


def test_full_disk_exits_4(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "trainguard", "index", str(SAMPLE_RUN), "--db", str(tmp_path / "f.db")],
                       capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size)
    assert p.returncode == 4, p.stderr
    assert "Traceback" not in p.stderr
    assert len([line for line in p.stderr.splitlines() if line.strip()]) == 1, p.stderr
