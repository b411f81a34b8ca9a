"""A run its scheduler requeued after a failure has one ``run_ended`` per allocation (the Slurm recipe): the
last one ends the run, so the report spans both allocations and says how the job ended."""

from __future__ import annotations

from pathlib import Path

from trainguard.accounting.goodput import compute_goodput
from trainguard.core.eventlog import EventWriter
from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    RunEnded,
    RunStarted,
    StepCompleted,
    final_run_end,
)


def test_the_last_run_ended_ends_a_requeued_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = RunEnded(time=8.0, host="n1", run_id="7", status="failed", exit_code=1)
    last = RunEnded(time=27.0, host="n1", run_id="7", status="completed", completed_steps=10)
    with EventWriter(run / "events" / "agent-n1.jsonl") as w:
        w.write(RunStarted(time=0.0, host="n1", run_id="7", world_size=1, target_steps=10))
        w.write(AttemptStarted(time=1.0, host="n1", attempt=0, world_size=1, hosts=("n1",)))
        w.write(AttemptEnded(time=7.0, host="n1", attempt=0, reason="failure"))
        w.write(first)
        w.write(AttemptStarted(time=20.0, host="n1", attempt=1, world_size=1, hosts=("n1",), resume_step=5))
        w.write(AttemptEnded(time=26.0, host="n1", attempt=1, reason="completed", exit_code=0))
        w.write(last)
    with EventWriter(run / "events" / "rank-0.jsonl") as w:
        for step in range(1, 11):
            t = 1.5 + step if step <= 5 else 15.5 + step
            w.write(StepCompleted(time=t, host="n1", attempt=0 if step <= 5 else 1, rank=0, step=step,
                                  duration_seconds=1.0))
    assert final_run_end([last, first]) is last and final_run_end([]) is None
    report = compute_goodput(run)
    assert report.status == "completed" and report.completed_steps == 10
    assert report.wall_seconds == 27.0
    accounted = report.productive_seconds + sum(report.badput_seconds.values())
    assert abs(accounted - report.wall_seconds) < 1e-6
    assert report.badput_seconds["restart"] > 10  # the time between the allocations
