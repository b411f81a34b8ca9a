"""Interval policy: Young/Daly formulas against published figures, recomputation, step/second rules."""

from __future__ import annotations

import math

import pytest

from trainguard.checkpoint.interval import IntervalPolicy, observed_mtbf
from trainguard.core.interval_theory import daly_seconds, young_seconds


def test_llama3_scale_figures_from_the_reliability_reference() -> None:
    mtbf = 3.09 * 3600  # Llama 3: one interruption every 3.09 h; a 60 s checkpoint
    assert young_seconds(60, mtbf) / 60 == pytest.approx(19.3, abs=0.05)
    assert daly_seconds(60, mtbf) / 60 == pytest.approx(18.6, abs=0.05)


def test_daly_saturates_at_mtbf_when_checkpoints_cost_more_than_two_mtbf() -> None:
    assert daly_seconds(500, 100) == 100
    assert daly_seconds(1e-6, 1e6) == pytest.approx(math.sqrt(2), rel=1e-2)


def test_step_policy_saves_on_multiples_only() -> None:
    policy = IntervalPolicy.every_steps(5)
    assert [s for s in range(1, 21) if policy.due(s, None, 0.0)] == [5, 10, 15, 20]
    with pytest.raises(ValueError):
        IntervalPolicy.every_steps(0)


def test_seconds_policy_waits_for_the_interval_and_never_saves_a_step_twice() -> None:
    policy = IntervalPolicy.every_seconds(30)
    assert not policy.due(7, 3, 29.9)
    assert policy.due(7, 3, 30.0)
    assert not policy.due(3, 3, 100.0)
    with pytest.raises(ValueError):
        IntervalPolicy.every_seconds(0)


def test_auto_recomputes_when_cost_or_mtbf_moves_enough() -> None:
    policy = IntervalPolicy.auto(mtbf_seconds=3600, save_cost_seconds=10)
    assert policy.policy == "daly" and policy.seconds == pytest.approx(daly_seconds(10, 3600))
    assert policy.with_measurements(save_cost_seconds=10.5) is None  # within 10%: keep, no event spam
    cheaper = policy.with_measurements(save_cost_seconds=0.5)
    assert cheaper is not None and cheaper.seconds == pytest.approx(daly_seconds(0.5, 3600))
    flakier = cheaper.with_measurements(mtbf_seconds=600)
    assert flakier is not None and flakier.seconds is not None and flakier.seconds < cheaper.seconds  # type: ignore[operator]
    assert IntervalPolicy.every_steps(3).with_measurements(save_cost_seconds=1) is None


def test_auto_clamps_and_validates() -> None:
    assert IntervalPolicy.auto(mtbf_seconds=1e9, save_cost_seconds=1e3, max_seconds=60).seconds == 60
    assert IntervalPolicy.auto(mtbf_seconds=1, save_cost_seconds=0.0001, min_seconds=5).seconds == 5
    young = IntervalPolicy.auto(mtbf_seconds=3600, save_cost_seconds=10, formula="young")
    assert young.seconds == pytest.approx(young_seconds(10, 3600))
    for bad in ({"mtbf_seconds": 0}, {"mtbf_seconds": 10, "formula": "guess"}):
        with pytest.raises(ValueError):
            IntervalPolicy.auto(**bad)  # type: ignore[arg-type]


def test_observed_mtbf() -> None:
    assert observed_mtbf(3600, 0) is None
    assert observed_mtbf(3600, 4) == 900


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"policy": "bogus"}, "policy"),
        ({"policy": "steps"}, "steps"),
        ({"policy": "steps", "steps": 0}, "steps"),
        ({"policy": "seconds"}, "seconds"),
        ({"policy": "seconds", "seconds": float("nan")}, "seconds"),
        ({"policy": "daly"}, "mtbf_seconds"),
        ({"policy": "steps", "steps": 5, "save_cost_seconds": -1.0}, "save_cost_seconds"),
        ({"policy": "steps", "steps": 5, "min_seconds": 10.0, "max_seconds": 5.0}, "min_seconds"),
    ],
)
def test_policies_validate_themselves_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"IntervalPolicy.{field}"):
        IntervalPolicy(**kwargs)  # type: ignore[arg-type]
