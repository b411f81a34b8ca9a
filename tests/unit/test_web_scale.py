"""The dashboard's run list stays cheap with many runs, and a run too large to read is listed, not read."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.core import events as ev
from trainguard.core.rundir import RunDir
from trainguard.web import app as web_app
from trainguard.web.app import Dashboard
from trainguard.web.catalog import CACHED_RUNS, Catalog


def _run(root: Path, name: str, steps: int = 1) -> Path:
    rd = RunDir(root / name).create()
    with rd.writer("agent-x") as w:
        w.write_all([ev.RunStarted(time=0.0, host="x", run_id=name, world_size=1),
                     ev.AttemptStarted(time=0.0, host="x", attempt=0, world_size=1),
                     *[ev.StepCompleted(time=2.0 + s, host="x", attempt=0, rank=0, step=s, duration_seconds=1.0)
                       for s in range(1, steps + 1)],
                     ev.RunEnded(time=3.0 + steps, host="x", run_id=name, status="completed",
                                 completed_steps=steps)])
    return rd.root


def test_listing_more_runs_than_the_report_cache_computes_each_report_once(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # 150 runs polled every 5 s took 13.5 s a listing: the 64-report cache thrashed, every row recomputed.
    root = tmp_path / "runs"
    count = CACHED_RUNS + 16
    for i in range(count):
        _run(root, f"run-{i:03d}")
    computed: list[Path] = []
    real = web_app.compute_goodput

    def counting(path: Path) -> object:
        computed.append(path)
        return real(path)

    monkeypatch.setattr(web_app, "compute_goodput", counting)
    dash = Dashboard(Catalog([root]))
    first = dash.runs_json()["runs"]
    assert len(first) == count and all(r["status"] == "completed" for r in first)
    assert len(computed) == count
    assert dash.runs_json()["runs"] == first
    assert len(computed) == count  # the second listing computed nothing
    _run(root, "run-000", steps=2)  # a changed run is recomputed, and only it
    again = {r["name"]: r for r in dash.runs_json()["runs"]}
    assert len(computed) == count + 1 and again["run-000"]["completed_steps"] == 2


def test_a_run_too_large_to_read_is_listed_as_such(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    _run(root, "small")
    _run(root, "huge", steps=200)
    dash = Dashboard(Catalog([root]))
    limit = sum(f.stat().st_size for f in (root / "small" / "events").iterdir()) + 1
    dash.cache.max_event_bytes = dash.summaries.max_event_bytes = limit
    rows = {r["name"]: r for r in dash.runs_json()["runs"]}
    assert rows["small"]["status"] == "completed" and rows["small"]["error"] is None
    assert rows["huge"]["status"] is None and "more than the dashboard reads" in rows["huge"]["error"]
    assert "trainguard report" in rows["huge"]["error"]
    entry = next(e for e in dash.catalog.entries() if e.path.name == "huge")
    report, _ = dash._report(entry)
    assert isinstance(report, Exception) and "MiB of events" in str(report)
