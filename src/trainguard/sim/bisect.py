"""The one bisection of the planners: the largest value of a monotone test that still passes (frontier and plan)."""

from __future__ import annotations

import math
from collections.abc import Callable


def largest_passing(check: Callable[[float], bool], lo: float, hi: float, *, iterations: int = 12,
                    log_scale: bool = False, hi_fails: bool = False) -> float | None:
    """Largest x in [lo, hi] with ``check(x)`` true, for a ``check`` that is true below some x and false
    above it; None when ``check(lo)`` fails already.

    Each of ``iterations`` steps halves the interval (its log ratio with ``log_scale``, which needs
    ``lo > 0``); the answer is the passing end, so it never overshoots. ``hi`` itself is tried first
    unless the caller knows it fails (``hi_fails``: one evaluation saved)."""
    if not check(lo):
        return None
    if not hi_fails and check(hi):
        return hi
    to_x: Callable[[float], float] = math.exp if log_scale else float
    a, b = (math.log(lo), math.log(hi)) if log_scale else (lo, hi)
    for _ in range(iterations):
        mid = (a + b) / 2
        if check(to_x(mid)):
            a = mid
        else:
            b = mid
    return to_x(a)
