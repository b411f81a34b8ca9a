"""trainguard.core.numeric: what counts as a number in every config and record check."""

from __future__ import annotations

import math

import pytest

from trainguard.core.numeric import in_range, is_number


@pytest.mark.parametrize("value", [0, -3, 2.5, 1 << 70, -0.0])
def test_numbers(value: object) -> None:
    assert is_number(value)


@pytest.mark.parametrize("value", [True, False, None, "1", math.nan, math.inf, -math.inf, [1], 1j])
def test_not_numbers(value: object) -> None:
    assert not is_number(value)


def test_integer_refuses_floats_and_bools() -> None:
    assert is_number(7, integer=True)
    assert not is_number(7.0, integer=True)
    assert not is_number(True, integer=True)


def test_range_is_inclusive_and_refuses_nan() -> None:
    assert in_range(1, 1, 3) and in_range(3, 1, 3) and in_range(2.5, 1, 3)
    assert not in_range(0.999, 1, 3) and not in_range(3.001, 1, 3)
    assert not in_range(math.nan, -math.inf, math.inf)
    assert not in_range(True, 0, 1)
    assert not in_range(2.0, 0, 3, integer=True)
