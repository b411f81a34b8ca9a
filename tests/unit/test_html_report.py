"""``trainguard report --html``: one self-contained file with the report's own numbers, safe with hostile data."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.accounting.goodput import compute_goodput
from trainguard.core import events as ev
from trainguard.core.rundir import RunDir
from trainguard.report.html import render_html, write_html
from trainguard.samples import SAMPLE_RUN


def data_block(html: str, name: str) -> dict:
    match = re.search(rf'<script type="application/json" id="{name}">(.*?)</script>', html, re.S)
    assert match, name
    return json.loads(match.group(1))


def test_the_file_carries_everything_it_needs(tmp_path: Path) -> None:
    out = write_html(SAMPLE_RUN, tmp_path / "report.html")
    html = out.read_text()
    # No fetch of any kind when opened: no external scripts, style sheets or images.
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"<link[^>]+stylesheet", html)
    assert not re.search(r"<img[^>]+src=", html)
    assert "Plotly" in html and "trainguard dashboard and HTML report" in html  # plotly.js and our script inlined
    assert len(html) > 3_000_000  # plotly.js alone is several MB: it really is inside
    # The numbers are the report's.
    view = data_block(html, "tg-data")
    assert view["report"] == json.loads(json.dumps(compute_goodput(SAMPLE_RUN).to_json()))
    config = data_block(html, "tg-config")
    assert config["api"] is None and config["poll_seconds"] == 0


def test_evidence_links_point_at_the_run_relative_to_the_file(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    shutil.copytree(SAMPLE_RUN, run)
    (run / "logs" / "attempt-0").mkdir(parents=True)
    (run / "logs" / "attempt-0" / "rank-5.log").write_text("Xid 48\n")
    out_dir = tmp_path / "reports"
    out_dir.mkdir()
    html = write_html(run, out_dir / "r1.html").read_text()
    assert data_block(html, "tg-config")["files_base"] == "../runs/r1/"
    evidence = data_block(html, "tg-data")["interruption_details"][0]["evidence"]
    assert evidence[0] == {"text": "logs/attempt-0/rank-5.log", "path": "logs/attempt-0/rank-5.log", "kind": "file"}
    assert evidence[1]["kind"] == "text"  # a log line, not a file


def test_hostile_event_text_cannot_break_out_of_the_data_block(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run").create()
    evil = "</script><script>window.pwned=1</script><!-- <img src=x onerror=alert(1)>"
    with rd.writer("agent-x") as w:
        w.write_all([
            ev.RunStarted(time=0.0, host="x", run_id=evil, world_size=1),
            ev.AttemptStarted(time=0.0, host="x", attempt=0, world_size=1),
            ev.StepCompleted(time=2.0, host="x", attempt=0, rank=0, step=1, duration_seconds=1.0),
            ev.FailureDetected(time=3.0, host="x", attempt=0, kind="crash", ranks=(0,), detail=evil,
                               evidence=("../../../etc/passwd", "/etc/passwd", evil)),
            ev.Diagnosis(time=3.0, host="x", attempt=0, category=evil, explanation=evil, confidence=1.0),
            ev.RunEnded(time=4.0, host="x", run_id=evil, status="failed"),
        ])
    html = render_html(rd.root)
    assert "window.pwned=1</script>" not in html and "<img src=x" not in html
    view = data_block(html, "tg-data")
    assert view["report"]["interruptions"][0]["category"] == evil
    # Paths out of the run directory are shown as text, never offered as links.
    assert [e["kind"] for e in view["interruption_details"][0]["evidence"]] == ["text", "text", "text"]


def test_cli_writes_the_file_and_keeps_stdout_for_json(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = subprocess.run([sys.executable, "-m", "trainguard", "report", str(SAMPLE_RUN), "--html", str(out), "--json"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["run_id"] == "sample-run"
    assert out.is_file() and f"written to {out}" in res.stderr


@pytest.mark.parametrize(("target", "code"), [("missing-dir/r.html", 4), (".", 2)])
def test_cli_errors_are_one_line_with_the_documented_code(tmp_path: Path, target: str, code: int) -> None:
    res = subprocess.run([sys.executable, "-m", "trainguard", "report", str(SAMPLE_RUN), "--html",
                          str(tmp_path / target), "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == code, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and res.stdout == ""
