"""The dashboard's simulation page for runs the simulator cannot redo: a reason on the page, never a crash."""

from __future__ import annotations

from pathlib import Path

from trainguard.core.eventlog import EventWriter
from trainguard.core.events import RunStarted
from trainguard.sim.models import builtin_models
from trainguard.web.simview import simulation_view


def _run(tmp_path: Path, config: dict[str, object]) -> Path:
    writer = EventWriter(tmp_path / "events" / "sim.jsonl")
    writer.write(RunStarted(time=1.0, host="sim", run_id="r1", world_size=16384, synthetic=True, config=config))
    writer.close()
    return tmp_path


def test_a_simulated_run_without_steps_is_unavailable_with_the_simulators_reason(tmp_path: Path) -> None:
    run = _run(tmp_path, {"simulator": "trainguard.sim", "model": builtin_models()[0], "days": 1.0})
    view = simulation_view(run)
    assert view["available"] is False and view["reason"]


def test_a_run_not_written_by_the_simulator_says_so(tmp_path: Path) -> None:
    view = simulation_view(_run(tmp_path, {}))
    assert view == {"available": False, "reason": "not a run written by trainguard simulate --events"}
