"""Resume points after a restart (`trainguard.accounting.resume`) and what goodput makes of them, hand-computed.

The stream: attempt 0 starts at 0, builds for 1 s, runs steps of 1 s over [1, 11], crashes at 11.5 (detected at
11.6); attempt 1 starts at 12, builds for 1 s and runs 10 steps over [13, 23]; the run ends at 23.5. How the
steps are numbered, and what else the run left behind, decides where attempt 1 resumed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainguard.accounting import resume
from trainguard.accounting.goodput import BUCKETS, compute_goodput
from trainguard.accounting.resume import AttemptSteps, Evidence, Scenario
from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointLoaded,
    Event,
    FailureDetected,
    RunEnded,
    RunStarted,
    StepCompleted,
)
from trainguard.core.rundir import RunDir
from trainguard.report.terminal import render_report

T0 = 1_700_000_000.0
WALL = 23.5


def _steps(attempt: int, first: int, start: float, numbering: str) -> list[Event]:
    return [StepCompleted(time=T0 + start + i + 1, host="h0", attempt=attempt, rank=r, step=first + i,
                          duration_seconds=1.0, numbering=numbering) for i in range(10) for r in range(2)]


def _write(run_dir: RunDir, numbering: str, first_again: int = 1, extra: list[Event] | None = None,
           command: list[str] | None = None) -> None:
    agent: list[Event] = [
        RunStarted(time=T0, host="h0", run_id="r", world_size=2, config={"command": command or ["train.py"]}),
        AttemptStarted(time=T0, host="h0", attempt=0, world_size=2),
        FailureDetected(time=T0 + 11.6, host="h0", attempt=0, kind="crash", ranks=(1,), detection_latency_seconds=0.1),
        AttemptEnded(time=T0 + 11.7, host="h0", attempt=0, reason="failure"),
        AttemptStarted(time=T0 + 12.0, host="h0", attempt=1, world_size=2),
        AttemptEnded(time=T0 + 23.2, host="h0", attempt=1, reason="completed", exit_code=0),
        RunEnded(time=T0 + WALL, host="h0", run_id="r", status="completed"),
    ]
    with run_dir.writer("agent-h0") as w:
        w.write_all(agent)
    with run_dir.writer("rank-0") as w:
        w.write_all(_steps(0, 1, 1, numbering) + _steps(1, first_again, 13, numbering) + (extra or []))


def _adds_up(report: object) -> None:
    total = report.productive_seconds + sum(report.badput_seconds.values())  # type: ignore[attr-defined]
    assert total == pytest.approx(WALL, rel=1e-6)
    assert set(report.badput_seconds) == set(BUCKETS)  # type: ignore[attr-defined]


def test_steps_counted_per_attempt_without_evidence_are_kept_and_the_loss_is_unknown(run_dir: RunDir) -> None:
    # SGD under the optimizer hooks: both attempts number their steps 1..10. Nothing says attempt 1 started over,
    # so attempt 0's ten steps are not lost progress (the old reading made them all lost: productive 10).
    _write(run_dir, "attempt")
    report = compute_goodput(run_dir)
    _adds_up(report)
    assert report.productive_seconds == pytest.approx(20.0)
    assert report.badput_seconds["lost_progress"] == pytest.approx(0.0)
    assert report.completed_steps == 20
    note = report.lost_progress_unknown
    assert note is not None and note["attempts"] == [1]
    # Had attempt 1 started over: steps 1-10 of attempt 0 and the half step before the crash lost: [1, 11.5].
    assert note["lost_progress_seconds_max"] == pytest.approx(10.5)
    assert note["ettr_min"] == pytest.approx(10.0 / WALL)
    assert note["completed_steps_min"] == 10
    (point,) = report.resume_points
    assert (point.attempt, point.step, point.source) == (1, None, "unknown")
    assert any(w.startswith("lost progress is unknown (attempt 1:") for w in report.warnings)
    doc = report.to_json()
    assert doc["lost_progress_unknown"]["attempts"] == [1]
    assert doc["resume_points"] == [{"attempt": 1, "step": None, "source": "unknown", "detail": point.detail}]
    assert "warning: lost progress is unknown" in render_report(report)


def _resumed_at_6(report: object, source: str) -> None:
    # attempt 1 ran steps 7-16: attempt 0's steps 7-10 [7, 11] and the half step [11, 11.5] were lost.
    _adds_up(report)
    assert report.productive_seconds == pytest.approx(16.0)  # type: ignore[attr-defined]
    assert report.badput_seconds["lost_progress"] == pytest.approx(4.5)  # type: ignore[attr-defined]
    assert report.completed_steps == 16  # type: ignore[attr-defined]
    assert report.lost_progress_unknown is None  # type: ignore[attr-defined]
    (point,) = report.resume_points  # type: ignore[attr-defined]
    assert (point.attempt, point.step, point.source) == (1, 6, source)
    assert not any("unknown" in w for w in report.warnings)  # type: ignore[attr-defined]


def test_a_framework_global_step_says_where_it_resumed(run_dir: RunDir) -> None:
    _write(run_dir, "framework", first_again=7)
    _resumed_at_6(compute_goodput(run_dir), "numbering")


def test_a_restored_optimizer_count_says_where_it_resumed(run_dir: RunDir) -> None:
    _write(run_dir, "optimizer", first_again=7)
    _resumed_at_6(compute_goodput(run_dir), "numbering")


def test_a_checkpoint_load_record_says_where_it_resumed(run_dir: RunDir) -> None:
    # The optimizer was not restored (its count starts at 1 again), but the load of step 6 was recorded.
    loaded = CheckpointLoaded(time=T0 + 13.0, host="h0", attempt=1, rank=0, step=6, seconds=0.0)
    _write(run_dir, "optimizer", extra=[loaded])
    _resumed_at_6(compute_goodput(run_dir), "checkpoint_loaded")


def test_a_resume_line_in_the_attempts_log_says_where_it_resumed(run_dir: RunDir) -> None:
    _write(run_dir, "attempt")
    logs = run_dir.root / "logs" / "attempt-1"
    logs.mkdir(parents=True)
    (logs / "rank-0.stdout.log").write_text("step 3 loss 2.5\nrank 0: resumed from step 6\nstep 7 loss 2.1\n")
    _resumed_at_6(compute_goodput(run_dir), "log")


def test_the_scripts_newest_checkpoint_before_the_restart_is_the_resume_point(run_dir: RunDir, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name, written in (("step_3.pt", 4.0), ("step_6.pt", 7.2), ("step_12.pt", 19.0), ("notes.txt", 8.0)):
        (ckpt / name).write_bytes(b"x")
        os.utime(ckpt / name, (T0 + written, T0 + written))
    _write(run_dir, "attempt", command=["train.py", f"--ckpt-dir={ckpt}"])
    report = compute_goodput(run_dir)
    _resumed_at_6(report, "checkpoint_files")
    assert "step_6.pt" in report.resume_points[0].detail


# --- the pure parts -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "step"), [
    ("[transformers]   Resuming training from checkpoint with epoch 0 and global step 250", 250),
    ("  Continuing training from global step 250", 250),
    ("Restoring states from the checkpoint path at /ckpt/epoch=0-step=250.ckpt", 250),
    ("rank 0: resumed from step 250", 250),
    ("Resuming from step=250 (epoch 3)", 250),
    ("Restoring states from the checkpoint path at /ckpt/last.ckpt", None),
    ("step 250 loss 2.31", None),
    ("Training completed. Do not forget to share your model", None),
])
def test_resume_lines(line: str, step: int | None) -> None:
    assert resume.resume_step_in_line(line) == step


@pytest.mark.parametrize(("name", "step"), [
    ("checkpoint-250", 250), ("epoch=1-step=250.ckpt", 250), ("ckpt_250.pt", 250), ("global_step250", 250),
    ("iter-0000250", 250), ("last.ckpt", None), ("model.safetensors", None),
])
def test_step_in_checkpoint_names(name: str, step: int | None) -> None:
    assert resume.step_in_name(name) == step


def test_an_unknown_resume_point_is_kept_or_redone_as_the_scenario_says() -> None:
    steps = [AttemptSteps(0, "attempt", 1, 252), AttemptSteps(1, "attempt", 1, 348), AttemptSteps(2, "attempt", 1, 5)]
    points = resume.infer(steps, loaded={2: 595})
    assert [points[a].source for a in (0, 1, 2)] == ["first", "unknown", "checkpoint_loaded"]
    assert resume.unknown(points) == [1]
    assert resume.offsets(steps, points, Scenario.KEPT) == {0: 0, 1: 252, 2: 595}
    assert resume.offsets(steps, points, Scenario.REDONE) == {0: 0, 1: 0, 2: 595}


def test_more_evidence_is_asked_only_for_numbers_that_say_nothing() -> None:
    asked: list[tuple[int, int]] = []

    def more(s: AttemptSteps, trained: int) -> Evidence | None:
        asked.append((s.attempt, trained))
        return Evidence(250, "log", "resumed from step 250")

    steps = [AttemptSteps(0, "optimizer", 1, 252), AttemptSteps(1, "optimizer", 251, 300),
             AttemptSteps(2, "optimizer", 1, 100)]
    points = resume.infer(steps, loaded={}, more=more)
    assert asked == [(2, 300)]
    assert (points[1].step, points[1].source) == (250, "numbering")
    assert (points[2].step, points[2].offset, points[2].source) == (250, 250, "log")
