"""Clock offsets between hosts from the step ends they share, directly or through another host."""

from __future__ import annotations

import pytest

from trainguard.core.clocks import estimate_offsets
from trainguard.core.events import Event, StepCompleted


def _steps(host: str, attempt: int, steps: range, skew: float) -> list[Event]:
    return [StepCompleted(time=1000.0 + step + skew, host=host, attempt=attempt, rank=0, step=step,
                          duration_seconds=1.0) for step in steps]


def test_hosts_sharing_steps_with_the_reference_get_its_offset() -> None:
    records = _steps("a", 0, range(1, 20), 0.0) + _steps("b", 0, range(1, 20), 2.5)
    assert estimate_offsets(records, "a") == {"a": 0.0, "b": pytest.approx(2.5)}


def test_a_spare_that_joined_after_the_reference_died_is_aligned_through_a_survivor() -> None:
    # a and b train in attempt 0; a dies; the spare c trains with b in attempt 1 and never shares a step with a.
    records = (_steps("a", 0, range(1, 10), 0.0) + _steps("b", 0, range(1, 10), 1.0)
               + _steps("b", 1, range(8, 20), 1.0) + _steps("c", 1, range(8, 20), -3.0))
    offsets = estimate_offsets(records, "a")
    assert offsets == {"a": 0.0, "b": pytest.approx(1.0), "c": pytest.approx(-3.0)}


def test_a_host_with_no_chain_to_the_reference_keeps_offset_zero() -> None:
    records = _steps("a", 0, range(1, 5), 0.0) + _steps("z", 7, range(1, 5), 9.0)
    assert estimate_offsets(records, "a") == {"a": 0.0, "z": 0.0}
