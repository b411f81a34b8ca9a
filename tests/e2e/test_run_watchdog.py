"""The supervisor's hang rule: learned timeout, floor, first-step and checkpoint allowances (pure logic)."""

from __future__ import annotations

from trainguard.launch.watchdog import Watchdog, WatchdogConfig


def beat(step: int, t: float, dur: float = 1.0, phase: str = "idle", pt: float | None = None) -> dict:
    return {"step": step, "time": t, "duration_seconds": dur, "phase": phase,
            "phase_start": t if pt is None else pt, "steps_done": step}


def test_timeout_is_learned_from_the_median_step_time_above_a_floor() -> None:
    w = Watchdog(WatchdogConfig(floor_seconds=4, multiplier=3))
    w.new_attempt(0.0)
    assert w.timeout_seconds() == 4  # nothing observed yet: the floor
    for i in range(1, 6):
        w.observe(0, beat(i, 100.0 + 2 * i, dur=2.0))
    assert w.median_step_seconds() == 2.0 and w.timeout_seconds() == 6.0
    w.observe(0, beat(5, 110.0, dur=50.0))  # the same step seen again adds no sample
    assert w.median_step_seconds() == 2.0
    beats = {0: beat(5, 110.0), 1: beat(5, 110.0)}
    assert w.check(beats, now=115.9) is None
    v = w.check(beats, now=116.5)
    assert v is not None and v.ranks == (0, 1) and v.onset == 110.0 and v.timeout_seconds == 6.0


def test_only_the_rank_past_its_deadline_is_late_and_onset_is_the_last_progress() -> None:
    w = Watchdog(WatchdogConfig(floor_seconds=4, multiplier=3))
    w.new_attempt(0.0)
    v = w.check({0: beat(7, 50.0), 1: beat(8, 53.0)}, now=55.0)
    assert v is not None and v.ranks == (0,) and v.onset == 53.0 and v.last_steps == {0: 7, 1: 8}


def test_first_step_allowance_covers_startup_and_restore() -> None:
    w = Watchdog(WatchdogConfig(floor_seconds=4, first_step_allowance_seconds=60, checkpoint_allowance_seconds=30))
    w.new_attempt(1000.0)
    init = {"step": 0, "time": 1000.5, "duration_seconds": 0.0, "phase": "checkpoint",
            "phase_start": 1001.0, "steps_done": 0}
    assert w.check({0: init, 1: None}, now=1059.0) is None
    v = w.check({0: init, 1: None}, now=1061.0)
    assert v is not None and v.ranks == (0, 1) and v.onset == 1000.0


def test_checkpoint_phase_gets_its_allowance_but_not_forever() -> None:
    w = Watchdog(WatchdogConfig(floor_seconds=4, checkpoint_allowance_seconds=30))
    w.new_attempt(0.0)
    saving = beat(10, 200.0, phase="checkpoint", pt=200.5)
    assert w.check({0: saving}, now=225.0) is None  # past the 4 s timeout, inside the allowance
    assert w.check({0: saving}, now=231.0) is not None
    assert w.check({0: beat(10, 200.0, phase="comm_wait", pt=200.5)}, now=205.0) is not None
    # A rank that finished training and shuts down (waits for the others) is not hung either.
    assert w.check({0: beat(10, 200.0, phase="done", pt=201.0)}, now=225.0) is None


def test_process_group_timeout_exceeds_every_watchdog_deadline() -> None:
    from pathlib import Path

    from trainguard.launch import SupervisorConfig

    cfg = SupervisorConfig(command=("x.py",), run_dir=Path("/tmp/x"), run_id="r", node_id="n",
                           watchdog=WatchdogConfig(first_step_allowance_seconds=300))
    assert cfg.pg_timeout_seconds() > cfg.watchdog.max_timeout_seconds() >= 300
