"""The hang timeout model: the longest recent step interval times a factor, a floor, a warm-up minimum; replay."""

from __future__ import annotations

import math

import pytest

from trainguard.launch.hang_timeout import FalseHang, StepIntervals, TimeoutModel, replay


def model(**kw: float) -> TimeoutModel:
    base = {"floor_seconds": 1.0, "multiplier": 3.0, "samples": 4, "warmup_samples": 0, "warmup_seconds": 4.0}
    return TimeoutModel(**{**base, **kw})  # type: ignore[arg-type]


def test_the_floor_holds_until_the_longest_interval_times_the_factor_passes_it() -> None:
    s = StepIntervals(model())
    assert s.timeout() == 1.0 and s.longest() is None
    s.add(0.2)
    assert s.timeout() == 1.0
    s.add(0.5)
    assert s.longest() == 0.5 and s.timeout() == 1.5


def test_only_the_recent_intervals_count() -> None:
    s = StepIntervals(model(samples=3))
    for x in (2.0, 0.1, 0.1, 0.1):
        s.add(x)
    assert s.longest() == 0.1 and s.timeout() == 1.0 and s.count == 4


def test_warm_up_minimum_until_enough_intervals() -> None:
    s = StepIntervals(model(warmup_samples=2))
    s.add(0.1)
    assert s.timeout() == 4.0
    s.add(0.1)
    assert s.timeout() == 1.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_nonsense_intervals_are_ignored(bad: float) -> None:
    s = StepIntervals(model())
    s.add(bad)
    assert s.count == 0 and s.timeout() == 1.0


def test_replay_judges_each_interval_by_the_timeout_learned_before_it() -> None:
    ends = [0.0, 0.1, 0.2, 0.3, 1.5, 1.6, 2.0]
    found, margin = replay(ends, model())
    # 1.2 s after 0.1 s steps: past the 1 s floor; then 0.4 s is within 3 x 1.2.
    assert found == [FalseHang(3, pytest.approx(1.2), 1.0)]
    assert margin == pytest.approx(1.0 / 1.2)
    assert replay([0.0, 0.5], model()) == ([], 2.0)
    assert replay([5.0], model()) == ([], math.inf)
