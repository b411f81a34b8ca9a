"""The no-progress rule: training progress is a step beyond every earlier attempt or a newer checkpoint."""

from __future__ import annotations

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
