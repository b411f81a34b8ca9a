"""trainguard.sim.bisect: the planners' one bisection, checked against thresholds known in advance."""

from __future__ import annotations

import math

import pytest

from trainguard.sim.bisect import largest_passing


@pytest.mark.parametrize("threshold", [0.3, 1.7, 9.99])
def test_finds_the_threshold_from_below_within_the_resolution(threshold: float) -> None:
    calls: list[float] = []

    def check(x: float) -> bool:
        calls.append(x)
        return x <= threshold

    got = largest_passing(check, 0.0, 10.0, iterations=12)
    assert got is not None
    assert got <= threshold < got + 10.0 / 2**12  # the passing end: never above the threshold
    assert len(calls) == 2 + 12  # both ends, then one test per halving


def test_log_scale_halves_the_ratio() -> None:
    threshold = 37.0
    got = largest_passing(lambda x: x <= threshold, 0.5, 4 * 3600.0, iterations=20, log_scale=True)
    assert got is not None
    assert got <= threshold
    assert math.log(threshold / got) < math.log(4 * 3600.0 / 0.5) / 2**20 * 1.0001


def test_ends() -> None:
    assert largest_passing(lambda x: False, 1.0, 2.0) is None  # not even the low end passes
    assert largest_passing(lambda x: True, 1.0, 2.0) == 2.0  # the high end passes: no bisection needed


def test_hi_fails_skips_the_high_end() -> None:
    seen: list[float] = []

    def check(x: float) -> bool:
        seen.append(x)
        return True  # would pass at 1 too: the caller's promise is what keeps 1 from being tried

    got = largest_passing(check, 0.0, 1.0, iterations=12, hi_fails=True)
    assert 1.0 not in seen
    assert got == pytest.approx(1 - 2**-12)
