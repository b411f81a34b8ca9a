"""The number checks shared by every config and record reader: a real number is an int or float, never a bool.

Each caller keeps its own message and error type; only the test lives here, so "a number" means the same
everywhere (True is not 1, NaN and infinity are not in any range)."""

from __future__ import annotations

import math
from typing import TypeGuard


def is_number(value: object, *, integer: bool = False) -> TypeGuard[float]:
    """``value`` is a finite int or float (an int with ``integer``); a bool is neither."""
    if isinstance(value, bool):
        return False
    if integer:
        return isinstance(value, int)
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def in_range(value: object, lo: float, hi: float, *, integer: bool = False) -> TypeGuard[float]:
    """`is_number` and ``lo <= value <= hi``."""
    return is_number(value, integer=integer) and lo <= value <= hi
