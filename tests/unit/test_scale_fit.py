"""The scale benchmark's fits: a line and a log-log slope that tell linear from faster growth."""

from __future__ import annotations

import pytest

from benchmarks.scale_fit import fit_and_project, line, loglog_slope


def test_a_line_through_exact_points_is_recovered() -> None:
    a, b = line([(4, 7.0), (8, 11.0), (16, 19.0), (32, 35.0)])
    assert a == pytest.approx(3.0) and b == pytest.approx(1.0)


def test_the_loglog_slope_tells_quadratic_from_linear_growth() -> None:
    assert loglog_slope([(n, 2.0 * n) for n in (4, 8, 16, 32)]) == pytest.approx(1.0)
    assert loglog_slope([(n, 0.5 * n * n) for n in (4, 8, 16, 32)]) == pytest.approx(2.0)
    assert loglog_slope([(4, 0.0), (8, 1.0)]) is None


def test_figures_of_runs_are_fitted_projected_and_flagged() -> None:
    runs = [{"hosts": n, "agent_cpu_per_second_at_rest": 0.01, "faults": [
        {"fault": "host-death", "first_step_seconds": 10.0 + n, "store_bytes": n * n * 100, "timed_out_seconds": 1}]}
        for n in (4, 8, 16)]
    fits = fit_and_project(runs, targets=(2048,))
    assert set(fits) == {"agent_cpu_per_second_at_rest", "host-death.first_step_seconds", "host-death.store_bytes"}
    assert fits["host-death.first_step_seconds"]["projected"]["2048"] == pytest.approx(2058.0)
    assert not fits["host-death.first_step_seconds"]["superlinear"]
    assert fits["host-death.store_bytes"]["superlinear"]
    assert fits["agent_cpu_per_second_at_rest"]["per_host"] == pytest.approx(0.0)
