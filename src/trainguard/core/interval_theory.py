"""Checkpoint-interval theory shared by the checkpointer's ``auto`` policy, the simulator and the planner.

Young (1974): T = sqrt(2 C M). Daly (2006): T = sqrt(2 C M) (1 + sqrt(C/(2M))/3 + C/(18M)) - C for
C < 2M, else T = M. Meta (Kokolis et al., arXiv 2410.21680): E[ETTR] ~ (1 - N r (u0 + dt/2)) / (1 + w/dt).
C: cost of one checkpoint to training; M: mean time between failures; all in seconds.
"""

from __future__ import annotations

import math

AUTO_FORMULA = "daly"
"""What ``auto`` means wherever an interval policy accepts it (checkpointer, simulator, planner): Daly's
higher-order optimum, which is closer than Young's to the true optimum when the save cost is not small
next to the MTBF, and equal to it to first order otherwise (docs/decisions.md)."""


def young_seconds(cost_seconds: float, mtbf_seconds: float) -> float:
    """Young's first-order optimum sqrt(2 C M)."""
    return math.sqrt(2.0 * cost_seconds * mtbf_seconds)


def daly_seconds(cost_seconds: float, mtbf_seconds: float) -> float:
    """Daly's higher-order optimum (compute time between checkpoints); M itself when C >= 2M."""
    c, m = cost_seconds, mtbf_seconds
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def meta_ettr(n_rate_per_second: float, u0_seconds: float, interval_seconds: float, stall_seconds: float) -> float:
    """Meta's approximation: E[ETTR] ~ (1 - N r (u0 + dt/2)) / (1 + w/dt). May go negative at high rates."""
    return (1 - n_rate_per_second * (u0_seconds + interval_seconds / 2)) / (1 + stall_seconds / interval_seconds)
