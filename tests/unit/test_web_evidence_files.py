"""The dashboard's evidence files: only real files under the run's own diagnostics/ and logs/, never through a link.

A run folder is written by the job's user; the dashboard may run as someone who can read more (an operator).
A symlinked ``logs/`` (``ln -s /etc logs``), ``diagnostics/`` or a linked file deeper down must not turn the
file route into a reader of files outside the run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from trainguard.core import events as ev
from trainguard.core.rundir import RunDir
from trainguard.report.view import build_view, evidence_link, open_evidence
from trainguard.web.app import create_app
from trainguard.web.catalog import Catalog

SECRET = "root:$6$not-for-the-dashboard\n"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside every run, holding a secret (the stand-in for /etc and /etc/shadow)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "shadow").write_text(SECRET)
    (etc / "sub").mkdir()
    (etc / "sub" / "shadow").write_text(SECRET)
    return etc


def _run(root: Path, name: str) -> RunDir:
    rd = RunDir(root / name).create()
    with rd.writer("agent-x") as w:
        w.write_all([ev.RunStarted(time=0.0, host="x", run_id=name, world_size=1),
                     ev.AttemptStarted(time=0.0, host="x", attempt=0, world_size=1),
                     ev.StepCompleted(time=2.0, host="x", attempt=0, rank=0, step=1, duration_seconds=1.0),
                     ev.RunEnded(time=3.0, host="x", run_id=name, status="completed", completed_steps=1)])
    return rd


@pytest.fixture
def runs(tmp_path: Path, outside: Path) -> Path:
    """Runs whose evidence folders or files are links out of the run, and one ordinary run."""
    root = tmp_path / "runs"
    # logs/ is a link to the outside folder
    linked_logs = _run(root, "linked-logs").root
    shutil.rmtree(linked_logs / "logs")
    os.symlink(outside, linked_logs / "logs")
    # diagnostics/ is a link to the outside folder
    linked_diag = _run(root, "linked-diag").root
    shutil.rmtree(linked_diag / "diagnostics")
    os.symlink(outside, linked_diag / "diagnostics")
    # real folders, with links deeper down: a folder and a file
    deep = _run(root, "deep").root
    (deep / "logs" / "attempt-0").mkdir(parents=True)
    os.symlink(outside / "shadow", deep / "logs" / "attempt-0" / "rank-0.log")
    os.symlink(outside, deep / "diagnostics" / "attempt-0")
    (deep / "logs" / "real.log").write_text("a real line\n")
    # a link that stays inside the run (refused too: every link is, see open_evidence)
    os.symlink(deep / "logs" / "real.log", deep / "logs" / "alias.log")
    return root


@pytest.fixture
def client(runs: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Catalog([runs]), token=None), base_url="http://127.0.0.1") as c:
        yield c


@pytest.mark.parametrize("path", [
    "linked-logs/files/logs/shadow",
    "linked-logs/files/logs/sub/shadow",
    "linked-logs/files/logs/",
    "linked-diag/files/diagnostics/shadow",
    "linked-diag/files/diagnostics/sub/shadow",
    "deep/files/logs/attempt-0/rank-0.log",
    "deep/files/diagnostics/attempt-0/shadow",
    "deep/files/diagnostics/attempt-0/sub/shadow",
    "deep/files/diagnostics/attempt-0/",
    "deep/files/logs/alias.log",
])
def test_a_link_at_any_depth_is_not_followed(client: TestClient, path: str) -> None:
    res = client.get(f"/runs/{path}")
    assert res.status_code == 404, (path, res.text[:200])
    assert "not-for-the-dashboard" not in res.text


def test_real_evidence_is_still_served_and_links_are_not_listed(client: TestClient) -> None:
    res = client.get("/runs/deep/files/logs/real.log")
    assert res.status_code == 200 and res.text == "a real line\n"
    assert res.headers["content-type"].startswith("text/plain")
    assert res.headers["content-security-policy"].endswith("sandbox")
    listing = client.get("/runs/deep/files/logs/")
    assert listing.status_code == 200
    assert "real.log" in listing.text and "alias.log" not in listing.text and "attempt-0" in listing.text


def test_a_fifo_is_refused_without_hanging(runs: Path, client: TestClient) -> None:
    os.mkfifo(runs / "deep" / "logs" / "pipe.log")
    assert client.get("/runs/deep/files/logs/pipe.log").status_code == 404


def test_evidence_through_a_link_is_shown_as_text_not_as_a_link(runs: Path) -> None:
    """The run page offers a link only for what the file route serves."""
    for run, item in (("linked-logs", "logs/shadow"), ("linked-diag", "diagnostics/sub/shadow"),
                      ("deep", "logs/attempt-0/rank-0.log"), ("deep", "logs/alias.log")):
        assert evidence_link(runs / run, item) == {"text": item, "path": None, "kind": "text"}, (run, item)
    assert evidence_link(runs / "deep", "logs/real.log")["kind"] == "file"
    assert build_view(runs / "linked-logs")["report"]["run_id"] == "linked-logs"


def test_open_evidence_refuses_paths_that_are_not_evidence(runs: Path) -> None:
    for rel in ("events/agent-x.jsonl", "logs/../events/agent-x.jsonl", "/etc/passwd", "", "logs/\0x"):
        with pytest.raises((OSError, ValueError)):
            os.close(open_evidence(runs / "deep", rel))
    fd = open_evidence(runs / "deep", "logs/./real.log")
    try:
        assert os.read(fd, 100) == b"a real line\n"
    finally:
        os.close(fd)
