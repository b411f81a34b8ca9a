"""A run page follows a job while it runs, and shows straggler and telemetry panels only when recorded."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.web.conftest import Server, wait_for
from trainguard.core import events as ev
from trainguard.core.rundir import RunDir

T0 = 1_767_000_000.0


def steps(attempt: int, first: int, last: int, start: float, *, slow_rank: int | None = None) -> list[ev.Event]:
    """Two ranks, one-second steps; ``slow_rank`` does 1.5 s of own work and the other waits for it."""
    out: list[ev.Event] = []
    for i, step in enumerate(range(first, last + 1)):
        end = start + (i + 1) * 1.5 if slow_rank is not None else start + i + 1
        for rank in (0, 1):
            dur = 1.5 if slow_rank is not None else 1.0
            wait = 0.0 if rank == slow_rank or slow_rank is None else 0.5
            out.append(ev.StepCompleted(time=end, host=f"h{rank}", attempt=attempt, rank=rank, step=step,
                                        duration_seconds=dur, phases={"forward_backward": dur - wait,
                                                                      "comm_wait": wait}))
    return out


@pytest.fixture
def live_run(tmp_path: Path) -> Path:
    rd = RunDir(tmp_path / "live" / "job").create()
    with rd.writer("agent-h0") as w:
        w.write_all([ev.RunStarted(time=T0, host="h0", run_id="job", world_size=2, nnodes=2, target_steps=40),
                     ev.AttemptStarted(time=T0, host="h0", attempt=0, world_size=2, hosts=("h0", "h1"))])
        w.write_all(steps(0, 1, 10, T0 + 2))
    return rd.root


def test_the_run_page_updates_while_the_job_runs(page: Any, live_run: Path, tmp_path: Path,
                                                  artifacts: Path) -> None:
    server = Server(str(live_run.parent), "--poll", "0.5", log=tmp_path / "serve.log")
    try:
        server.open(page, "/runs/job")
        wait_for(page, "window.tgReady === true", timeout=30)
        assert page.inner_text("#status") == "incomplete"
        assert page.get_attribute("#steps", "data-value") == "10"
        assert page.locator("#live").is_visible()
        renders = page.evaluate("window.tgRenders")
        # The job goes on: a crash, a restart from step 5, ten more steps.
        with RunDir(live_run).writer("agent-h0") as w:
            w.write_all([
                ev.FailureDetected(time=T0 + 14, host="h0", attempt=0, kind="crash", ranks=(1,), hosts=("h1",),
                                   detection_latency_seconds=0.5, step=10),
                ev.Diagnosis(time=T0 + 14.2, host="h0", attempt=0, category="Faulty GPU", group="GPU",
                             culprit_ranks=(1,), culprit_hosts=("h1",), confidence=0.9, explanation="Xid 79"),
                ev.AttemptEnded(time=T0 + 14.5, host="h0", attempt=0, reason="failure", exit_code=1),
                ev.AttemptStarted(time=T0 + 16, host="h0", attempt=1, world_size=2, hosts=("h0", "h2"),
                                  resume_step=5),
                *steps(1, 6, 25, T0 + 18),
            ])
        wait_for(page, f"window.tgRenders > {renders} && "
                               "document.getElementById('steps').getAttribute('data-value') === '25'",
                               timeout=30)
        page.screenshot(path=str(artifacts / "live-after-restart.png"))
        assert page.locator("#interruptions tbody tr").count() == 1
        assert "Faulty GPU" in page.inner_text("#interruptions")
        # The job ends: the page stops polling.
        with RunDir(live_run).writer("agent-h0") as w:
            w.write_all([ev.AttemptEnded(time=T0 + 40, host="h0", attempt=1, reason="completed", exit_code=0),
                         ev.RunEnded(time=T0 + 40, host="h0", run_id="job", status="completed", completed_steps=25)])
        wait_for(page, "document.getElementById('status').textContent === 'completed'", timeout=30)
        done = page.evaluate("window.tgRenders")
        time.sleep(1.5)
        assert page.evaluate("window.tgRenders") == done
        assert page.locator("#live").is_hidden()
    finally:
        server.stop()


def test_straggler_heat_map_and_telemetry_appear_when_recorded(page: Any, live_run: Path, tmp_path: Path,
                                                               artifacts: Path) -> None:
    with RunDir(live_run).writer("agent-h0") as w:
        w.write_all([*steps(0, 11, 40, T0 + 12, slow_rank=1),
                     ev.StragglerDetected(time=T0 + 40, host="h0", attempt=0, rank=1, node="h1", step=26,
                                          onset_step=11, slowdown=1.5, cost_seconds=7.5, signal="phases"),
                     ev.RunEnded(time=T0 + 60, host="h0", run_id="job", status="completed", completed_steps=40)])
    with RunDir(live_run).writer("telemetry-h1") as w:
        w.write_all([ev.TelemetrySample(time=T0 + s, host="h1", source="gpu", device="gpu0", temperature_c=60.0 + s / 4,
                                        clock_mhz=1980.0 - s, max_clock_mhz=1980.0, power_watts=600.0)
                     for s in range(0, 60, 5)])
    server = Server(str(live_run), log=tmp_path / "serve.log")
    try:
        server.open(page, "/runs/job")
        wait_for(page, "window.tgReady === true", timeout=30)
        page.screenshot(path=str(artifacts / "stragglers-telemetry.png"), full_page=True)
        assert page.locator("#stragglers-section").is_visible()
        heat = page.evaluate("() => document.getElementById('straggler-heatmap').data[0]")
        assert heat["type"] == "heatmap" and heat["y"] == ["rank 0", "rank 1"]
        late = [v for v in heat["z"][1] if v is not None]  # rank 1's own time over the slow stretch
        assert max(late) == pytest.approx(1.5 / ((1.5 + 1.0) / 2), rel=1e-3)
        assert page.locator("#stragglers tbody tr").count() == 1
        assert page.locator("#telemetry-section").is_visible()
        names = page.evaluate("() => document.getElementById('telemetry').data.map(t => t.yaxis)")
        assert sorted(set(names)) == ["y", "y2", "y3"]
    finally:
        server.stop()
