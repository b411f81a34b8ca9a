"""How each figure of benchmarks/scale.py grows with the number of hosts: a least-squares line and the log-log
slope, projected to large host counts. Pure arithmetic, unit-tested (tests/unit/test_scale_fit.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

SUPERLINEAR_SLOPE = 1.2
"""A log-log slope above this says the figure grows faster than linearly (noise on 4 points allows ~0.2)."""


def line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = a + b * n`` through ``points`` of (n, y): (a, b)."""
    count = len(points)
    mean_n = sum(n for n, _ in points) / count
    mean_y = sum(y for _, y in points) / count
    spread = sum((n - mean_n) ** 2 for n, _ in points)
    slope = 0.0 if spread == 0 else sum((n - mean_n) * (y - mean_y) for n, y in points) / spread
    return mean_y - slope * mean_n, slope


def loglog_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """The exponent ``k`` of ``y ~ n**k`` (least squares on logs); None when a figure is not positive."""
    if len(points) < 2 or any(n <= 0 or y <= 0 for n, y in points):
        return None
    return line([(math.log(n), math.log(y)) for n, y in points])[1]


def _figures(runs: Iterable[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    series: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        n = float(run["hosts"])
        for key in ("agent_cpu_per_second_at_rest", "store_bytes_per_second_at_rest", "per_host_rss_mb",
                    "start_to_steady_seconds"):
            if isinstance(run.get(key), (int, float)):
                series.setdefault(key, []).append((n, float(run[key])))
        for fault in run.get("faults", []):
            for key, value in fault.items():
                if key.endswith(("_seconds", "_bytes", "_packets")) and key != "timed_out_seconds" \
                        and isinstance(value, (int, float)):
                    series.setdefault(f"{fault['fault']}.{key}", []).append((n, float(value)))
    return series


def fit_and_project(runs: Iterable[dict[str, Any]], targets: Sequence[int]) -> dict[str, Any]:
    """Per figure with at least two host counts: the line, the log-log slope, whether it grows faster than
    linearly, and the line's value at each of ``targets``."""
    out: dict[str, Any] = {}
    for name, points in sorted(_figures(runs).items()):
        if len({n for n, _ in points}) < 2:
            continue
        a, b = line(points)
        k = loglog_slope(points)
        out[name] = {"intercept": a, "per_host": b, "loglog_slope": k,
                     "superlinear": k is not None and k > SUPERLINEAR_SLOPE,
                     "projected": {str(t): a + b * t for t in targets}, "points": points}
    return out
