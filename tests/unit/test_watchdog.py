"""The supervisor's hang rule on heartbeat records: per progress source, monotonic time, allowances."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from trainguard.core.protocol import Heartbeat
from trainguard.launch.watchdog import Watchdog, WatchdogConfig


def script(step: int, t: float, dur: float = 1.0, phase: str = "idle", pt: float | None = None,
           n: int | None = None) -> Heartbeat:
    """A heartbeat of a rank counting steps through trainguard.attach()."""
    return Heartbeat(step=step, steps_done=step if n is None else n, progress_mono=t, duration_seconds=dur,
                     phase=phase, phase_start_mono=t if pt is None else pt, source="script")


def auto(step: int, t: float, *, dur: float = 1.0, coll: int = 0, pending: float = 0.0, alive: float = 0.0,
         phase: str = "step", pt: float | None = None) -> Heartbeat:
    """A heartbeat of an unmodified script watched through optimizer hooks and the flight recorder."""
    return Heartbeat(step=step, steps_done=step, progress_mono=t, duration_seconds=dur, phase=phase,
                     phase_start_mono=t if pt is None else pt, source="optimizer", collectives_done=coll,
                     pending_since_mono=pending, alive_mono=alive)


def silent(t: float, alive: float = 0.0) -> Heartbeat:
    return Heartbeat(step=0, steps_done=0, progress_mono=t, duration_seconds=0.0, phase="init",
                     phase_start_mono=t, source="none", alive_mono=alive)


def watchdog(start: float = 0.0, **kw: float) -> Watchdog:
    cfg = WatchdogConfig(**{"floor_seconds": 4.0, "multiplier": 3.0, **kw})  # type: ignore[arg-type]
    w = Watchdog(cfg)
    w.new_attempt(start)
    return w


# --- script source: step-based rule ------------------------------------------------------------------


def test_timeout_is_learned_from_the_longest_recent_step_interval_above_a_floor() -> None:
    w = watchdog(warmup_samples=0)
    assert w.timeout_seconds() == 4  # nothing observed yet: the floor
    for i in range(1, 6):
        w.check({0: script(i, 100.0 + 2 * i, dur=0.5)}, now=100.0 + 2 * i)
    # Step end to step end: 2 s (the steps' own 0.5 s leaves out the time between them).
    assert w.longest_step_seconds() == 2.0 and w.timeout_seconds() == 6.0
    w.check({0: script(5, 110.0, dur=50.0)}, now=110.0)  # the same step seen again adds no sample
    assert w.longest_step_seconds() == 2.0
    beats = {0: script(5, 110.0, dur=2.0), 1: script(5, 110.0, dur=2.0)}
    assert w.check(beats, now=115.9) is None
    v = w.check(beats, now=116.5)
    assert v is not None and v.ranks == (0, 1) and v.onset_mono == 110.0 and v.timeout_seconds == 6.0


def test_the_first_step_of_an_attempt_adds_its_own_length_not_the_start_up_before_it() -> None:
    w = watchdog(warmup_samples=0, floor_seconds=0.5)
    w.new_attempt(1000.0)
    w.check({0: script(1, 1090.0, dur=0.2)}, now=1090.0)  # 90 s of imports and restore, then a 0.2 s step
    assert w.longest_step_seconds() == 0.2 and w.timeout_seconds() == pytest.approx(0.6)
    w.check({0: script(4, 1090.9, dur=0.25)}, now=1091.0)  # three steps between two reads: 0.3 s each
    assert w.longest_step_seconds() == pytest.approx(0.3)


def test_until_a_few_intervals_are_known_the_timeout_is_at_least_the_busy_allowance() -> None:
    w = watchdog(floor_seconds=1.0, busy_allowance_seconds=4.0, warmup_samples=3)
    w.check({0: script(1, 1.0, dur=0.1)}, now=1.0)
    w.check({0: script(2, 1.1, dur=0.1)}, now=1.1)
    assert w.timeout_seconds() == 4.0
    w.check({0: script(3, 1.2, dur=0.1)}, now=1.2)
    assert w.timeout_seconds() == 1.0


def test_only_the_rank_past_its_deadline_is_late_and_onset_is_the_last_progress() -> None:
    w = watchdog()
    v = w.check({0: script(7, 50.0), 1: script(8, 53.0)}, now=55.0)
    assert v is not None and v.ranks == (0,) and v.onset_mono == 53.0 and v.last_steps == {0: 7, 1: 8}


def test_first_step_allowance_covers_startup_and_restore_once_a_signal_was_seen() -> None:
    w = watchdog(start=0.0, first_step_allowance_seconds=60, checkpoint_allowance_seconds=30)
    w.check({0: script(3, 10.0)}, now=10.0)  # attempt 0 sent steps: a signal exists in this run
    w.new_attempt(1000.0)
    init = script(0, 1000.5, dur=0.0, phase="checkpoint", pt=1001.0)
    assert w.check({0: init, 1: None}, now=1059.0) is None
    v = w.check({0: init, 1: None}, now=1061.0)
    assert v is not None and v.ranks == (0, 1) and v.onset_mono == 1000.0


def test_checkpoint_phase_gets_its_allowance_but_not_forever() -> None:
    w = watchdog(checkpoint_allowance_seconds=30)
    saving = script(10, 200.0, phase="checkpoint", pt=200.5)
    assert w.check({0: saving}, now=225.0) is None  # past the 4 s timeout, inside the allowance
    assert w.check({0: saving}, now=231.0) is not None
    assert w.check({0: script(10, 200.0, phase="comm_wait", pt=200.5)}, now=205.0) is not None
    # A rank that finished training and shuts down (waits for the others) is not hung either.
    assert w.check({0: script(10, 200.0, phase="done", pt=201.0)}, now=225.0) is None


# --- no signal: crashes only ---------------------------------------------------------------------------


def test_ranks_without_any_progress_signal_are_never_declared_hung_and_warned_about_once(
        caplog: pytest.LogCaptureFixture) -> None:
    w = watchdog(first_step_allowance_seconds=60)
    caplog.set_level(logging.WARNING, logger="trainguard.launch.watchdog")
    for now in (10.0, 61.0, 500.0, 10_000.0):
        assert w.check({0: silent(1.0), 1: None}, now=now) is None
    w.new_attempt(20_000.0)
    assert w.check({0: silent(20_001.0)}, now=30_000.0) is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "no progress signal" in warnings[0] and "hangs will not be detected" in warnings[0]


def test_first_step_allowance_does_not_apply_before_any_signal_was_seen() -> None:
    w = watchdog(first_step_allowance_seconds=60)
    assert w.check({0: silent(1.0)}, now=1000.0) is None  # silent script: crash-only
    w.check({0: script(1, 1001.0)}, now=1001.0)  # now a signal exists
    w.new_attempt(2000.0)
    assert w.check({0: silent(2001.0)}, now=2059.0) is None
    v = w.check({0: silent(2001.0)}, now=2061.0)
    assert v is not None and v.ranks == (0,)


# --- optimizer source: a hang is a wait -----------------------------------------------------------------


def test_long_phase_without_collectives_is_not_a_hang() -> None:
    w = watchdog()
    for i in range(1, 6):
        w.check({0: auto(i, float(i), coll=2 * i, alive=float(i)), 1: auto(i, float(i), coll=2 * i, alive=float(i))},
                now=float(i))
    # Validation: no step, no collective for 100 s, but nobody waits in a collective and both are alive.
    for now in (20.0, 50.0, 105.0):
        beats = {r: auto(5, 5.0, coll=10, alive=now - 0.5, phase="step") for r in (0, 1)}
        assert w.check(beats, now=now) is None


def test_wait_in_a_collective_past_the_timeout_is_a_hang_with_its_latency_from_last_progress() -> None:
    w = watchdog()
    for i in range(1, 6):
        w.check({r: auto(i, float(i), coll=2 * i, alive=float(i)) for r in (0, 1)}, now=float(i))
    assert w.timeout_seconds() == 4.0
    # Rank 0 stopped before the all-reduce; rank 1 waits in it since 5.2.
    beats = {0: auto(5, 5.0, coll=10, alive=9.0), 1: auto(5, 5.0, coll=10, pending=5.2, alive=9.0)}
    assert w.check(beats, now=9.1) is None  # no progress for 4.1 s, but the wait is only 3.9 s old
    v = w.check({0: auto(5, 5.0, coll=10, alive=9.3), 1: auto(5, 5.0, coll=10, pending=5.2, alive=9.3)}, now=9.3)
    assert v is not None and v.waiting_ranks == (1,) and v.onset_mono == 5.0
    assert v.ranks == (0, 1) and "waiting in a collective" in v.reason


def test_completed_collectives_count_as_progress() -> None:
    w = watchdog()
    w.check({0: auto(1, 1.0, coll=2, alive=1.0)}, now=1.0)
    # No step for a long time, but collectives keep completing (e.g. a long evaluation with all-reduces).
    for k, now in enumerate((4.0, 7.0, 10.0, 13.0), start=3):
        assert w.check({0: auto(1, 1.0, coll=k, pending=now - 0.5, alive=now)}, now=now) is None
    v = w.check({0: auto(1, 1.0, coll=6, pending=13.5, alive=18.0)}, now=18.0)
    assert v is not None and v.onset_mono == 13.0


def test_stopped_process_with_stale_heartbeat_is_a_hang_culprit_signal() -> None:
    w = watchdog()
    for i in range(1, 4):
        w.check({r: auto(i, float(i), coll=i, alive=float(i)) for r in (0, 1)}, now=float(i))
    # Rank 1 was SIGSTOPped at 3.2: its background thread stopped; rank 0 idles outside any collective.
    beats = {0: auto(3, 3.0, coll=3, alive=9.9), 1: auto(3, 3.0, coll=3, alive=3.2)}
    v = w.check(beats, now=10.0)
    assert v is not None and v.stale_ranks == (1,) and v.ranks == (1,)


def test_optimizer_ranks_get_the_first_step_allowance_before_their_first_step() -> None:
    w = watchdog(first_step_allowance_seconds=60)
    w.check({0: auto(1, 1.0, coll=1, alive=1.0)}, now=1.0)
    w.new_attempt(100.0)
    # Restore: rank 1 waits in a barrier while rank 0 loads the checkpoint.
    beats = {0: auto(0, 100.5, alive=150.0), 1: auto(0, 100.5, pending=101.0, alive=150.0)}
    assert w.check(beats, now=150.0) is None
    assert w.check(beats, now=161.0) is not None


# --- clocks -------------------------------------------------------------------------------------------------


def test_a_wall_clock_step_neither_fakes_nor_hides_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    beats_ok = {0: script(5, 100.0, dur=1.0)}
    decisions = []
    real = time.time
    for jump in (0.0, 3600.0, -3600.0):
        monkeypatch.setattr(time, "time", lambda j=jump: real() + j)
        w = watchdog()
        decisions.append((w.check(beats_ok, now=102.0), w.check(beats_ok, now=104.5)))
    assert all(quiet is None and hung is not None for quiet, hung in decisions)


def test_heartbeat_times_are_monotonic_and_the_agent_compares_them_with_the_monotonic_clock() -> None:
    src = (Path(__file__).resolve().parents[2] / "src" / "trainguard" / "launch" / "watchdog.py").read_text()
    assert "time.time" not in src and "import time" not in src  # the rule never reads a clock itself


# --- busy ranks, stopped ranks: how long a wait is given -------------------------------------------------


def _steady(w: Watchdog, upto: int) -> None:
    for i in range(1, upto + 1):
        w.check({r: auto(i, i * 0.1, dur=0.1, coll=2 * i, alive=i * 0.1) for r in (0, 1)}, now=i * 0.1)


def test_a_stopped_rank_the_others_wait_for_is_a_hang_at_the_learned_timeout() -> None:
    w = watchdog(floor_seconds=1.0, busy_allowance_seconds=4.0, alive_stale_seconds=1.5)
    _steady(w, 10)  # 0.1 s steps: the timeout is the 1 s floor
    assert w.timeout_seconds() == 1.0
    # Rank 1 was SIGSTOPped at 1.05 (its last write); rank 0 waits in the next step's all-reduce since 1.2.
    beats = {0: auto(10, 1.0, dur=0.1, coll=20, pending=1.2, alive=2.5), 1: auto(10, 1.0, dur=0.1, coll=20, alive=1.05)}
    assert w.check(beats, now=2.5) is None  # rank 1's silence (1.45 s) is not yet a stop
    v = w.check({**beats, 0: auto(10, 1.0, dur=0.1, coll=20, pending=1.2, alive=2.6)}, now=2.6)
    assert v is not None and v.stale_ranks == (1,) and v.ranks == (1,) and v.timeout_seconds == 1.0


def test_a_rank_silent_while_it_tears_down_after_a_peer_finished_is_not_frozen() -> None:
    # CI at load 8: rank 1 exited 0 after the last step; rank 0 printed "done" but its interpreter's shutdown
    # kept its heartbeat thread silent past alive_stale_seconds. That is no hang (it was reported as one).
    w = watchdog(floor_seconds=1.0, alive_stale_seconds=1.5, checkpoint_allowance_seconds=30.0)
    _steady(w, 10)
    silent_rank0 = {0: auto(10, 1.0, dur=0.1, coll=21, alive=1.1)}
    assert w.check(silent_rank0, now=1.2, finished=1) is None
    assert w.check(silent_rank0, now=8.0, finished=1) is None
    v = w.check(silent_rank0, now=31.5, finished=1)  # past the allowance: frozen after all
    assert v is not None and v.stale_ranks == (0,)
    # Its last beat written inside the final barrier: still silence in a teardown, not a wait.
    in_barrier = {0: auto(10, 1.0, dur=0.1, coll=20, pending=1.05, alive=1.1)}
    w3 = watchdog(floor_seconds=1.0, alive_stale_seconds=1.5, checkpoint_allowance_seconds=30.0)
    _steady(w3, 10)
    assert w3.check(in_barrier, now=1.2, finished=1) is None
    assert w3.check(in_barrier, now=8.0, finished=1) is None
    # Without a finished peer the same silence is a stopped process at once.
    w2 = watchdog(floor_seconds=1.0, alive_stale_seconds=1.5, checkpoint_allowance_seconds=30.0)
    _steady(w2, 10)
    assert w2.check(silent_rank0, now=1.2) is None
    assert w2.check(silent_rank0, now=8.0) is not None


def test_a_rank_left_waiting_for_a_finished_peer_is_still_a_hang_at_the_timeout() -> None:
    w = watchdog(floor_seconds=1.0, alive_stale_seconds=1.5, checkpoint_allowance_seconds=30.0)
    _steady(w, 10)
    assert w.check({0: auto(10, 1.0, dur=0.1, coll=20, pending=1.1, alive=1.2)}, now=1.2, finished=1) is None
    v = w.check({0: auto(10, 1.0, dur=0.1, coll=20, pending=1.1, alive=3.9)}, now=4.0, finished=1)
    assert v is not None and v.waiting_ranks == (0,)
    # A script rank too: silent in teardown is given the allowance, waiting is not.
    s = watchdog(floor_seconds=1.0, warmup_samples=0, alive_stale_seconds=1.5, checkpoint_allowance_seconds=30.0)
    s.check({0: script(5, 5.0, dur=0.1), 1: script(5, 5.0, dur=0.1)}, now=5.0)
    assert s.check({0: script(5, 5.0, dur=0.1)}, now=5.1, finished=1) is None
    assert s.check({0: script(5, 5.0, dur=0.1)}, now=20.0, finished=1) is None
    waiting = Heartbeat(step=5, steps_done=5, progress_mono=5.0, duration_seconds=0.1, phase="step",
                        phase_start_mono=5.0, source="script", pending_since_mono=5.05, alive_mono=19.9)
    assert s.check({0: waiting}, now=20.0, finished=1) is not None


def test_a_rank_at_work_while_the_others_wait_gets_the_busy_allowance() -> None:
    w = watchdog(floor_seconds=1.0, busy_allowance_seconds=4.0)
    _steady(w, 10)
    # Rank 0 saves a checkpoint (alive, in no collective); rank 1 waits in the next all-reduce since 1.1.
    def beats(now: float) -> dict[int, Heartbeat]:
        return {0: auto(10, 1.0, dur=0.1, coll=20, alive=now - 0.2),
                1: auto(10, 1.0, dur=0.1, coll=20, pending=1.1, alive=now - 0.2)}
    for now in (2.5, 4.0, 4.9):
        assert w.check(beats(now), now=now) is None
    v = w.check(beats(5.1), now=5.1)  # a loop stuck for good on rank 0 is still found, at the busy allowance
    assert v is not None and v.waiting_ranks == (1,) and v.timeout_seconds == 4.0
    assert "rank(s) [0] at work outside any collective" in v.reason


def test_a_rank_inside_a_save_gets_the_checkpoint_allowance_not_the_busy_one() -> None:
    """Rank 0 exports the weights (a save that is no checkpoint: phase ``save``) while rank 1 waits in the
    final barrier: the pattern of every script that saves its model on rank 0 at the end."""
    w = watchdog(floor_seconds=1.0, busy_allowance_seconds=4.0, checkpoint_allowance_seconds=60.0)
    _steady(w, 10)

    def beats(now: float) -> dict[int, Heartbeat]:
        return {0: auto(10, 1.0, dur=0.1, coll=20, alive=now - 0.2, phase="save", pt=1.05),
                1: auto(10, 1.0, dur=0.1, coll=20, pending=1.1, alive=now - 0.2)}
    for now in (5.1, 30.0, 61.0):
        assert w.check(beats(now), now=now) is None
    v = w.check(beats(61.1), now=61.1)  # a save stuck for good (a dead file system) is still found
    assert v is not None and v.waiting_ranks == (1,)


def test_a_script_rank_at_work_gets_the_busy_allowance_a_stopped_one_the_timeout() -> None:
    w = watchdog(floor_seconds=1.0, busy_allowance_seconds=4.0, warmup_samples=0, alive_stale_seconds=1.5)
    for i in range(1, 6):
        w.check({0: script(i, i * 0.1, dur=0.1)}, now=i * 0.1)
    working = Heartbeat(step=5, steps_done=5, progress_mono=0.5, duration_seconds=0.1, phase="eval",
                        phase_start_mono=0.5, source="script", alive_mono=3.0)
    assert w.check({0: working}, now=3.0) is None
    stopped = Heartbeat(step=5, steps_done=5, progress_mono=0.5, duration_seconds=0.1, phase="step",
                        phase_start_mono=0.5, source="script", alive_mono=0.6)
    assert w.check({0: stopped}, now=3.0) is not None
    # Rank 1 waits in a collective for rank 0, at work: rank 1 is not late before the busy allowance either.
    waiting = Heartbeat(step=5, steps_done=5, progress_mono=0.5, duration_seconds=0.1, phase="step",
                        phase_start_mono=0.5, source="script", alive_mono=3.0, pending_since_mono=0.6)
    assert w.check({0: working, 1: waiting}, now=3.0) is None
    v = w.check({0: stopped, 1: waiting}, now=3.0)
    assert v is not None and v.ranks == (0, 1)



def test_a_rank_the_kernel_shows_frozen_is_hung_without_the_timeout_or_the_busy_allowance() -> None:
    w = watchdog(floor_seconds=4.0, busy_allowance_seconds=4.0, alive_stale_seconds=5.0)
    _steady(w, 10)
    # Rank 1 was SIGSTOPped mid-step at 1.05 (its last write): to the heartbeats alone it looks at work, so rank 0
    # waiting for it is given the busy allowance (4 s from the last progress at 1.0).
    beats = {0: auto(10, 1.0, dur=0.1, coll=20, pending=1.2, alive=3.3), 1: auto(10, 1.0, dur=0.1, coll=20, alive=1.05)}
    assert w.check(beats, now=3.4) is None
    # The kernel confirms it frozen: hung now, rank 1 the culprit, the evidence in the reason.
    v = w.check(beats, now=3.4, frozen=[1])
    assert v is not None and v.ranks == (1,) and v.stale_ranks == (1,) and v.onset_mono == 1.0
    assert "the kernel shows rank(s) [1] frozen" in v.reason and "at work" not in v.reason
    # Before the first step the start-up allowance still holds; inside a save, the checkpoint allowance.
    early = watchdog(first_step_allowance_seconds=120.0)
    assert early.check({0: auto(0, 0.0, alive=1.0, pending=0.5), 1: auto(0, 0.0, alive=0.2)}, now=3.0,
                       frozen=[1]) is None
    saving = watchdog(checkpoint_allowance_seconds=60.0)
    _steady(saving, 10)
    in_save = {0: auto(10, 1.0, dur=0.1, coll=20, pending=1.2, alive=3.3),
               1: auto(10, 1.0, dur=0.1, coll=20, alive=1.05, phase="save", pt=1.02)}
    assert saving.check(in_save, now=3.4, frozen=[1]) is None
    # A finished peer: a silent rank is tearing down (`teardown` deals with it), not called hung at once.
    assert w.check({1: beats[1]}, now=3.5, finished=1, frozen=[1]) is None


def test_a_script_rank_the_kernel_shows_frozen_is_late_at_once() -> None:
    w = watchdog(floor_seconds=4.0, busy_allowance_seconds=4.0, warmup_samples=0, alive_stale_seconds=5.0)
    for i in range(1, 6):
        w.check({0: script(i, i * 0.1, dur=0.1), 1: script(i, i * 0.1, dur=0.1)}, now=i * 0.1)
    stopped = Heartbeat(step=5, steps_done=5, progress_mono=0.5, duration_seconds=0.1, phase="step",
                        phase_start_mono=0.5, source="script", alive_mono=0.6)
    waiting = Heartbeat(step=5, steps_done=5, progress_mono=0.5, duration_seconds=0.1, phase="step",
                        phase_start_mono=0.5, source="script", alive_mono=2.5, pending_since_mono=0.6)
    assert w.check({0: stopped, 1: waiting}, now=2.6) is None  # 2.1 s without a step: under the 4 s floor
    v = w.check({0: stopped, 1: waiting}, now=2.6, frozen=[0])
    assert v is not None and v.ranks == (0,)

def test_the_recorded_healthy_runs_give_no_false_hang_under_the_default_model() -> None:
    # Real 2-rank runs on a loaded 2-core host (a CPU burner and other jobs beside them), replayed through the
    # default timeout model in the strictest reading (every long interval as if the others waited).
    import json

    from trainguard.launch.hang_timeout import replay

    model = WatchdogConfig().timeout_model()
    recorded = Path(__file__).parent / "recorded"
    for name in ("stragglers-contended-healthy", "stragglers-contended-slow-rank1"):
        rows = json.loads((recorded / f"{name}.json").read_text())["rows"]
        for rank in (0, 1):
            ends = sorted(r[2] for r in rows if r[0] == rank)
            found, margin = replay(ends, model)
            assert found == [] and margin > 1.0, (name, rank, found[:3])
