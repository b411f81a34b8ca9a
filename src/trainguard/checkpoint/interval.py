"""When to checkpoint: every N steps, every T seconds, or ``auto`` (Young/Daly optimum).

Young (1974): T = sqrt(2 C M). Daly (2006): T = sqrt(2 C M) (1 + sqrt(C/(2M))/3 + C/(18M)) - C for
C < 2M, else T = M; C is the cost of one checkpoint to training, M the mean time between failures.
``auto`` recomputes T whenever a measured save cost or a new MTBF arrives (see docs/checkpoint.md).
This module is pure: no torch, no clocks of its own (callers pass ``now``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trainguard.core.interval_theory import daly_seconds, young_seconds

POLICIES = ("steps", "seconds", "young", "daly")
"""Valid values of `IntervalPolicy.policy`."""


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


@dataclass(frozen=True)
class IntervalPolicy:
    """How often to save. Build with `every_steps`, `every_seconds` or `auto`."""

    policy: str
    """``steps``, ``seconds``, ``young`` or ``daly`` (``auto`` is ``daly``)."""
    steps: int | None = None
    """Save every this many steps (``steps`` policy)."""
    seconds: float | None = None
    """Save when this many seconds passed since the last save (``seconds``; computed for young/daly)."""
    mtbf_seconds: float | None = None
    """Mean time between failures used by young/daly (configured or observed)."""
    save_cost_seconds: float = 10.0
    """Cost of one save to training (blocking seconds); replaced by measurements."""
    min_seconds: float = 1.0
    """Lower clamp of the computed interval."""
    max_seconds: float = 6 * 3600.0
    """Upper clamp of the computed interval."""
    change_threshold: float = 0.1
    """A recomputed interval is adopted (and reported) only when it moves by more than this fraction."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"IntervalPolicy.policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.policy == "steps" and (
            not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1
        ):
            raise ValueError(f"IntervalPolicy.steps must be an integer >= 1 for policy 'steps', got {self.steps!r}")
        if self.policy == "seconds" and not _positive(self.seconds):
            raise ValueError(f"IntervalPolicy.seconds must be > 0 for policy 'seconds', got {self.seconds!r}")
        if self.policy in ("young", "daly") and not _positive(self.mtbf_seconds):
            raise ValueError(
                f"IntervalPolicy.mtbf_seconds must be > 0 for policy {self.policy!r}, got {self.mtbf_seconds!r}"
            )
        if not (math.isfinite(self.save_cost_seconds) and self.save_cost_seconds >= 0):
            raise ValueError(f"IntervalPolicy.save_cost_seconds must be >= 0, got {self.save_cost_seconds!r}")
        if not (_positive(self.min_seconds) and _positive(self.max_seconds) and self.min_seconds <= self.max_seconds):
            raise ValueError(
                f"IntervalPolicy.min_seconds and max_seconds must be > 0 with min <= max, "
                f"got {self.min_seconds!r} and {self.max_seconds!r}"
            )
        if not (math.isfinite(self.change_threshold) and self.change_threshold >= 0):
            raise ValueError(f"IntervalPolicy.change_threshold must be >= 0, got {self.change_threshold!r}")

    @classmethod
    def every_steps(cls, steps: int) -> IntervalPolicy:
        return cls(policy="steps", steps=steps)

    @classmethod
    def every_seconds(cls, seconds: float) -> IntervalPolicy:
        return cls(policy="seconds", seconds=float(seconds))

    @classmethod
    def auto(
        cls,
        mtbf_seconds: float,
        *,
        save_cost_seconds: float = 10.0,
        formula: str = "daly",
        min_seconds: float = 1.0,
        max_seconds: float = 6 * 3600.0,
    ) -> IntervalPolicy:
        if formula not in ("young", "daly"):
            raise ValueError(f"IntervalPolicy.auto formula must be 'young' or 'daly', got {formula!r}")
        base = cls(
            policy=formula,
            mtbf_seconds=float(mtbf_seconds),
            save_cost_seconds=float(save_cost_seconds),
            min_seconds=min_seconds,
            max_seconds=max_seconds,
        )
        return replace(base, seconds=base.optimum())

    @property
    def time_based(self) -> bool:
        return self.policy != "steps"

    def optimum(self) -> float:
        """The young/daly interval for the current cost and MTBF, clamped."""
        if self.mtbf_seconds is None:  # only young/daly call this, and they validated it
            raise ValueError(f"policy {self.policy!r} has no optimum: it needs mtbf_seconds")
        cost = max(self.save_cost_seconds, 1e-6)
        fn = young_seconds if self.policy == "young" else daly_seconds
        return min(max(fn(cost, self.mtbf_seconds), self.min_seconds), self.max_seconds)

    def with_measurements(
        self, *, save_cost_seconds: float | None = None, mtbf_seconds: float | None = None
    ) -> IntervalPolicy | None:
        """A recomputed policy when the new cost/MTBF moves the interval enough, else None."""
        if self.policy not in ("young", "daly"):
            return None
        new = replace(
            self,
            save_cost_seconds=self.save_cost_seconds if save_cost_seconds is None else save_cost_seconds,
            mtbf_seconds=self.mtbf_seconds if mtbf_seconds is None else mtbf_seconds,
        )
        interval = new.optimum()
        old = self.seconds or 0.0
        if old > 0 and abs(interval - old) <= self.change_threshold * old:
            return None
        return replace(new, seconds=interval)

    def due(self, step: int, last_save_step: int | None, seconds_since_last_save: float) -> bool:
        """Whether ``step`` should be saved."""
        if self.policy == "steps" and self.steps is not None:  # validated: always set for "steps"
            return step % self.steps == 0
        if last_save_step is not None and step <= last_save_step:
            return False
        return seconds_since_last_save >= (self.seconds or 0.0)


def observed_mtbf(wall_seconds: float, failures: int) -> float | None:
    """MTBF from a run's history: wall time over failures (None before the first failure)."""
    if failures <= 0 or wall_seconds <= 0:
        return None
    return wall_seconds / failures
