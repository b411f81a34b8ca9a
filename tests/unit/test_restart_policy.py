"""The no-progress rule: training progress is a step beyond every earlier attempt or a newer checkpoint."""

from __future__ import annotations

from pathlib import Path

from trainguard.launch.policy import AttemptOutcome, NoProgressRule


def test_steps_beyond_the_previous_attempts_count_as_progress_without_any_checkpoint() -> None:
    rule = NoProgressRule(max_no_progress_attempts=2, max_restarts=10)
    for best in (5, 9, 14):  # a script that never saves trainguard checkpoints, yet trains further each time
        d = rule.on_failure(AttemptOutcome(best_step=best, latest_checkpoint=None), restarts_left=5)
        assert d.progressed and not d.stop and d.attempts_without_progress == 0


def test_attempts_that_repeat_the_same_steps_stop_the_run() -> None:
    rule = NoProgressRule(max_no_progress_attempts=2, max_restarts=10)
    assert rule.on_failure(AttemptOutcome(8, 5), restarts_left=5).progressed
    d = rule.on_failure(AttemptOutcome(7, 5), restarts_left=5)  # resumed at 5, died before 8
    assert not d.progressed and not d.stop and d.attempts_without_progress == 1
    d = rule.on_failure(AttemptOutcome(8, 5), restarts_left=5)  # equal is not beyond
    assert d.stop and d.reason is not None and d.reason.startswith("no progress")
    assert "no step beyond 8" in d.reason and "2 failed attempts" in d.reason


def test_a_new_checkpoint_is_progress_even_without_a_higher_step() -> None:
    rule = NoProgressRule(max_no_progress_attempts=1, max_restarts=10)
    rule.on_failure(AttemptOutcome(10, None), restarts_left=5)
    d = rule.on_failure(AttemptOutcome(10, 10), restarts_left=5)
    assert d.progressed and not d.stop


def test_an_attempt_that_completed_no_step_made_no_progress() -> None:
    rule = NoProgressRule(max_no_progress_attempts=1, max_restarts=3)
    d = rule.on_failure(AttemptOutcome(None, None), restarts_left=3)
    assert d.stop and not d.progressed
    rule = NoProgressRule(max_no_progress_attempts=1, max_restarts=3)
    assert rule.on_failure(AttemptOutcome(0, None), restarts_left=3).stop


def test_spent_budget_stops_with_its_own_reason() -> None:
    rule = NoProgressRule(max_no_progress_attempts=3, max_restarts=2)
    d = rule.on_failure(AttemptOutcome(4, None), restarts_left=0)
    assert d.stop and d.reason == "restart budget spent (2 restarts)"


def test_a_framework_checkpoint_is_progress_and_global_steps_resuming_further_each_time_are_too() -> None:
    # A Hugging Face Trainer under its adapter: crashed at 200 (checkpoint-150), then 120 steps into each attempt.
    # Its global steps go 199 -> 269 -> 369 -> 469: every attempt is progress (no "no progress" stop).
    rule = NoProgressRule(max_no_progress_attempts=3, max_restarts=5)
    for best, saved in ((199, 150), (269, 250), (369, 350), (469, 450)):
        d = rule.on_failure(AttemptOutcome(best, None, framework_checkpoint=saved), restarts_left=3)
        assert d.progressed and not d.stop
    # The same global step again, but the framework saved a newer checkpoint: still progress.
    rule = NoProgressRule(max_no_progress_attempts=1, max_restarts=5)
    rule.on_failure(AttemptOutcome(100, None, framework_checkpoint=90), restarts_left=3)
    assert rule.on_failure(AttemptOutcome(100, None, framework_checkpoint=100), restarts_left=3).progressed
    d = rule.on_failure(AttemptOutcome(100, None, framework_checkpoint=100), restarts_left=3)
    assert d.stop and d.reason is not None and "framework's: 100" in d.reason


def test_framework_checkpoints_are_read_from_the_ranks_event_files(tmp_path: Path) -> None:
    from trainguard.core.eventlog import EventWriter
    from trainguard.core.events import CheckpointSaveFinished, StepCompleted
    from trainguard.core.protocol import RunLayout
    from trainguard.launch.framework_progress import FrameworkCheckpoints

    layout = RunLayout(tmp_path)
    reader = FrameworkCheckpoints(layout)
    assert reader.latest() is None

    def save(rank: int, step: int, framework: str, ok: bool = True) -> CheckpointSaveFinished:
        return CheckpointSaveFinished(time=1.0, attempt=0, rank=rank, step=step, blocking_seconds=0.1,
                                      total_seconds=0.1, ok=ok, framework=framework)

    with EventWriter(layout.rank_events(0)) as w:
        w.write(StepCompleted(time=1.0, attempt=0, rank=0, step=10, duration_seconds=0.1, numbering="framework"))
        w.write(save(0, 10, "transformers"))
        w.write(save(0, 40, ""))  # trainguard's own checkpointer: counted through latest_checkpoint instead
    assert reader.latest() == 10
    with EventWriter(layout.rank_events(1)) as w:
        w.write(save(1, 20, "lightning"))
        w.write(save(1, 30, "lightning", ok=False))
    assert reader.latest() == 20
    with EventWriter(layout.rank_events(0)) as w:
        w.write(save(0, 25, "transformers"))
    assert reader.latest() == 25
