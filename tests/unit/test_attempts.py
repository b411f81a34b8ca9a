"""The attempt decisions (`trainguard.launch.attempts`): every failure path, the attempt number and the restart
budget with its refunds, driven the way the agent drives them (torch's counter charged by `torch_restarted`)."""

from __future__ import annotations

from trainguard.launch.attempts import (
    Attempts,
    Corruption,
    Crash,
    Event,
    Exclude,
    Hang,
    HealthGate,
    InProcess,
    InProcessDone,
    Leave,
    NodeLost,
    Proceed,
    Restart,
    Stop,
    StragglerLeave,
)
from trainguard.launch.policy import AttemptOutcome


class Steps:
    """Outcomes that always progress (a step beyond the last), so only the budget can stop a run."""

    def __init__(self) -> None:
        self.step = 0

    def __call__(self) -> AttemptOutcome:
        self.step += 10
        return AttemptOutcome(best_step=self.step, latest_checkpoint=None)


def _whole_process_restart(a: Attempts) -> None:
    """What torch's loop does after a FAILED round while restarts are left: charge and rendezvous again."""
    assert a.restarts_left() > 0
    a.torch_restarted(counted=True)
    a.rendezvous()


def test_attempt_numbers_count_rendezvous_and_a_spare_continues_the_jobs_numbers() -> None:
    a = Attempts(max_restarts=3, max_no_progress_attempts=3)
    assert a.number == -1
    assert a.rendezvous() == 0
    assert a.joined(attempts_ended=4) == 4  # a spare joining a job that already ended attempts 0-3
    assert a.joined(attempts_ended=2) == 4  # never backwards
    assert a.rendezvous() == 5


def test_a_crash_restarts_the_whole_group_and_torchs_charge_spends_the_budget() -> None:
    a, out = Attempts(max_restarts=2, max_no_progress_attempts=5), Steps()
    a.rendezvous()
    assert a.decide(Crash((1,), "crash", out())) == Restart()
    assert a.restarts_left() == 2  # deciding charges nothing: torch's loop does, and we follow it
    _whole_process_restart(a)
    assert a.restarts_left() == 1 and a.number == 1
    assert a.decide(Crash((0,), "exit", out())) == Restart()
    _whole_process_restart(a)
    decision = a.decide(Crash((0,), "exit", out()))
    assert decision == Stop("restart budget spent (2 restarts)")
    assert a.restarts_left() == 0 and a.stop_reason == "restart budget spent (2 restarts)"


def test_a_membership_change_torch_does_not_charge_costs_nothing() -> None:
    a = Attempts(max_restarts=1, max_no_progress_attempts=5)
    a.rendezvous()
    a.torch_restarted(counted=False)  # a node joined, or a peer's failure restarted the round
    assert a.restarts_left() == 1


def test_hang_crash_node_lost_and_corruption_all_go_through_the_no_progress_rule() -> None:
    stuck = AttemptOutcome(best_step=7, latest_checkpoint=None)
    pairs: list[tuple[Event, Event]] = [(Hang((1,), stuck), Crash((0,), "crash", stuck)),
                                        (NodeLost(stuck), Corruption(stuck))]
    for events in pairs:
        a = Attempts(max_restarts=10, max_no_progress_attempts=1)
        a.rendezvous()
        assert a.decide(events[0]) == Restart()  # the first attempt reached step 7: progress
        _whole_process_restart(a)
        decision = a.decide(events[1])  # step 7 again: no progress
        assert isinstance(decision, Stop) and decision.reason.startswith("no progress")
        assert a.restarts_left() == 0


def test_a_replaceable_crash_restarts_in_process_with_the_next_attempt_and_one_charge() -> None:
    a, out = Attempts(max_restarts=3, max_no_progress_attempts=5, in_process=True), Steps()
    a.rendezvous()
    decision = a.decide(Crash((3, 1), "exit", out(), replaceable=True))
    assert decision == InProcess(ranks=(1, 3), kill=False, kind="exit", previous=0, attempt=1)
    assert a.number == 1 and a.restarts_left() == 2 and a.pending == decision
    assert a.decide(InProcessDone(recovered=True)) == Proceed()
    assert a.pending is None and a.restarts_left() == 2  # a recovered try keeps its charge


def test_a_hang_restarts_in_process_killing_the_culprits() -> None:
    a, out = Attempts(max_restarts=3, max_no_progress_attempts=5, in_process=True), Steps()
    a.rendezvous()
    assert a.decide(Hang((2,), out(), replaceable=True)) == InProcess((2,), True, "hang", 0, 1)


def test_in_process_is_not_tried_when_it_cannot_be_done() -> None:
    out = Steps()
    cases: list[tuple[Attempts, Event]] = [
        (Attempts(3, 5, in_process=False), Crash((1,), "crash", out(), replaceable=True)),  # not asked for
        (Attempts(3, 5, in_process=True), Crash((1,), "crash", out(), replaceable=False)),  # another node's rank
        (Attempts(3, 5, in_process=True), Hang((), out(), replaceable=True)),  # nobody blamed
        (Attempts(3, 5, in_process=True), NodeLost(out())),  # the lost node's ranks are not ours to start
        (Attempts(3, 5, in_process=True), Corruption(out())),  # corrupted state: roll back, every rank
    ]
    for a, event in cases:
        a.rendezvous()
        assert a.decide(event) == Restart(), event
        assert a.number == 0 and a.restarts_left() == 3 and a.pending is None


def test_a_spent_budget_stops_instead_of_restarting_in_process() -> None:
    a = Attempts(max_restarts=0, max_no_progress_attempts=5, in_process=True)
    a.rendezvous()
    assert a.decide(Crash((1,), "crash", Steps()(), replaceable=True)) == Stop("restart budget spent (0 restarts)")
    assert a.number == 0


def test_an_in_process_try_that_times_out_falls_back_and_counts_once_with_its_fallback() -> None:
    a, out = Attempts(max_restarts=2, max_no_progress_attempts=5, in_process=True), Steps()
    a.rendezvous()
    assert isinstance(a.decide(Crash((1,), "crash", out(), replaceable=True)), InProcess)
    assert a.restarts_left() == 1
    decision = a.decide(InProcessDone(recovered=False, why="1 of 2 ranks formed the process group within 3s"))
    assert decision == Restart(abandoned="1 of 2 ranks formed the process group within 3s")
    assert a.pending is None and a.restarts_left() == 2  # given back: torch charges the fallback restart
    _whole_process_restart(a)
    assert a.restarts_left() == 1 and a.number == 2


def test_a_failure_during_an_in_process_try_abandons_it_for_a_whole_process_restart() -> None:
    a, out = Attempts(max_restarts=3, max_no_progress_attempts=5, in_process=True), Steps()
    a.rendezvous()
    a.decide(Crash((1,), "crash", out(), replaceable=True))
    decision = a.decide(Crash((0, 1), "crash", out(), replaceable=True))
    assert decision == Restart(abandoned="rank(s) 0, 1 failed during the recovery")
    assert a.pending is None and a.restarts_left() == 3 and a.number == 1
    _whole_process_restart(a)
    assert a.restarts_left() == 2  # the try and its fallback: one restart


def test_corruption_during_an_in_process_try_abandons_it_too() -> None:
    # Before the decisions had one place, only a crash or a hang gave a pending try up: one left pending through
    # the restart after corruption timed out later and stopped the healthy attempt that followed.
    a, out = Attempts(max_restarts=3, max_no_progress_attempts=5, in_process=True), Steps()
    a.rendezvous()
    a.decide(Hang((1,), out(), replaceable=True))
    decision = a.decide(Corruption(out()))
    assert decision == Restart(abandoned="Corruption during the recovery")
    assert a.pending is None and a.restarts_left() == 3
    assert a.decide(InProcessDone(recovered=False, why="late timeout")) == Proceed()  # nothing pending any more
    assert a.restarts_left() == 3


def test_a_stop_while_an_in_process_try_is_pending_still_abandons_it() -> None:
    stuck = AttemptOutcome(best_step=None, latest_checkpoint=None)
    a = Attempts(max_restarts=3, max_no_progress_attempts=2, in_process=True)
    a.rendezvous()
    assert isinstance(a.decide(Crash((1,), "crash", stuck, replaceable=True)), InProcess)
    decision = a.decide(Crash((1,), "crash", stuck, replaceable=True))
    assert isinstance(decision, Stop) and decision.reason.startswith("no progress")
    assert decision.abandoned == "rank(s) 1 failed during the recovery"
    assert a.restarts_left() == 0


def test_a_fallback_after_torch_stopped_restarts_stops() -> None:
    a = Attempts(max_restarts=3, max_no_progress_attempts=5, in_process=True)
    a.rendezvous()
    a.decide(Crash((1,), "crash", Steps()(), replaceable=True))
    a.torch_stopped()
    decision = a.decide(InProcessDone(recovered=False, why="timeout"))
    assert decision == Stop("torch disabled restarts (a worker stuck in uninterruptible sleep)", "timeout")


def test_torch_disabling_restarts_stops_at_the_next_failure_with_its_reason() -> None:
    a = Attempts(max_restarts=3, max_no_progress_attempts=5)
    a.rendezvous()
    a.torch_stopped()
    assert a.restarts_left() == 0
    decision = a.decide(Crash((0,), "crash", Steps()()))
    assert decision == Stop("torch disabled restarts (a worker stuck in uninterruptible sleep)")


def test_a_straggler_hand_over_is_a_planned_interruption_that_costs_no_restart() -> None:
    a = Attempts(max_restarts=1, max_no_progress_attempts=5)
    a.rendezvous()
    assert a.decide(StragglerLeave("rank 3 is 40% slower", this_node=True)) == Leave("rank 3 is 40% slower")
    _whole_process_restart(a)
    assert a.restarts_left() == 1
    assert a.decide(StragglerLeave("rank 5 is slow", this_node=False)) == Restart(planned=True)  # a peer left
    _whole_process_restart(a)
    assert a.restarts_left() == 1 and a.number == 2


def test_the_health_gate_excludes_with_every_reason_or_lets_the_node_start() -> None:
    a = Attempts(max_restarts=1, max_no_progress_attempts=5)
    assert a.decide(HealthGate(())) == Proceed()
    assert a.decide(HealthGate(("disk full", "known lemon"))) == Exclude("disk full; known lemon")
    assert a.restarts_left() == 1


def test_in_process_done_without_a_pending_try_changes_nothing() -> None:
    a = Attempts(max_restarts=1, max_no_progress_attempts=5, in_process=True)
    a.rendezvous()
    assert a.decide(InProcessDone(recovered=True)) == Proceed()
    assert a.restarts_left() == 1 and a.number == 0
