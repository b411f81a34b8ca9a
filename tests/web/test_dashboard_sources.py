"""Where runs come from (the fleet database, read-only) and what hostile run data cannot do to a page."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from tests.web.conftest import Server, trainguard, wait_for
from trainguard.core import events as ev
from trainguard.core.rundir import RunDir
from trainguard.samples import SAMPLE_RUN

EVIL = "</script><script>window.pwned=1</script><img src=x onerror=\"window.pwned=2\">"


def test_runs_of_the_fleet_database_are_listed_and_the_database_is_not_written(page: Any, tmp_path: Path) -> None:
    run = tmp_path / "elsewhere" / "sample-run"
    shutil.copytree(SAMPLE_RUN, run)
    db = tmp_path / "fleet.db"
    res = trainguard("index", str(run), "--db", str(db))
    assert res.returncode == 0, res.stderr
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    server = Server("--db", str(db), log=tmp_path / "serve.log")
    try:
        server.open(page, "/")
        wait_for(page, "window.tgReady === true")
        row = page.locator("#runs tr[data-run='sample-run']")
        assert row.count() == 1 and "db" in row.inner_text()
        server.open(page, "/runs/sample-run")
        wait_for(page, "window.tgReady === true")
        assert page.inner_text("#ettr") == "74.4%"
    finally:
        server.stop()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("fleet.db")) == ["fleet.db"]  # no -wal/-shm


def test_a_missing_database_is_an_input_error(tmp_path: Path) -> None:
    res = trainguard("serve", "--db", str(tmp_path / "none.db"), timeout=60)
    assert res.returncode == 3 and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_hostile_event_text_is_shown_as_text(page: Any, tmp_path: Path, artifacts: Path) -> None:
    rd = RunDir(tmp_path / "runs" / "evil").create()
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the dashboard")
    os.symlink(secret, rd.root / "diagnostics" / "leak.txt")  # a link out of the run directory
    with rd.writer("agent-x") as w:
        w.write_all([
            ev.RunStarted(time=0.0, host="x", run_id=EVIL, world_size=1),
            ev.AttemptStarted(time=0.0, host="x", attempt=0, world_size=1),
            ev.StepCompleted(time=2.0, host="x", attempt=0, rank=0, step=1, duration_seconds=1.0),
            ev.FailureDetected(time=3.0, host=EVIL, attempt=0, kind=EVIL, ranks=(0,), hosts=(EVIL,), detail=EVIL,
                               evidence=("diagnostics/leak.txt", "javascript:alert(1)")),
            ev.Diagnosis(time=3.0, host="x", attempt=0, category=EVIL, explanation=EVIL, confidence=1.0),
            ev.RunEnded(time=4.0, host="x", run_id=EVIL, status="failed"),
        ])
    server = Server(str(rd.root.parent), log=tmp_path / "serve.log")
    try:
        server.open(page, "/runs/evil")
        wait_for(page, "window.tgReady === true")
        page.screenshot(path=str(artifacts / "hostile-run.png"))
        assert page.evaluate("window.pwned") is None
        assert page.locator("main img").count() == 0
        assert EVIL in page.inner_text("#interruptions")
        # Neither evidence entry is a link: one leaves the run directory, the other is not a path.
        assert page.locator("#interruptions td.evidence a").count() == 0
        assert server.get("/runs/evil/files/diagnostics/leak.txt")[0] == 404
    finally:
        server.stop()
