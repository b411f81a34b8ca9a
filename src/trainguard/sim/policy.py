"""Job and recovery-policy configuration for the simulator, and the closed-form interval formulas.

Young (1974), Daly (2006) and Meta's analytic ETTR approximation (Kokolis et al. 2025) live here so
the simulator, the planner and the tests share one implementation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trainguard.errors import UsageError
from trainguard.interval_theory import daly_seconds, young_seconds

MAX_GPUS = 10_000_000
MAX_DAYS = 3650.0
MAX_TRIALS = 1_000_000


@dataclass(frozen=True)
class JobConfig:
    """The simulated job."""

    gpus: int = 16384
    """Number of GPUs the synchronous job needs (a multiple of the model's GPUs per node is not required)."""
    days: float = 54.0
    """Wall-clock horizon of each trial."""
    step_seconds: float = 10.0
    """Time of one training step when nothing goes wrong."""


@dataclass(frozen=True)
class PolicyConfig:
    """How the job checkpoints and recovers."""

    interval: str = "young"
    """``young``, ``daly``, ``auto`` or a number of minutes (as text), resolved by
    `checkpoint_interval_seconds` (``auto`` is resolved by `trainguard.sim.plan.resolve_auto` first;
    left unresolved it means Young)."""
    checkpoint_stall_seconds: float = 60.0
    """Time training stops for each save (the blocking part; async staging for async saves)."""
    checkpoint_total_seconds: float | None = None
    """From a save's start until it is durable (None: same as the stall, i.e. a synchronous save)."""
    restart_overhead_seconds: float = 600.0
    """From failure detection to the first new step: relaunch + startup + restore."""
    relaunch_seconds: float = 60.0
    """The part of the overhead before workers start (teardown, rescheduling, node swap)."""
    restore_seconds: float = 120.0
    """The part of the overhead spent loading the checkpoint."""
    crash_detection_seconds: float = 30.0
    """Detection latency of crashes (a process exits, peers see a remote error)."""
    hang_timeout_seconds: float = 600.0
    """Detection latency of hangs: the watchdog timeout."""
    sdc_check_seconds: float = 3600.0
    """Interval of silent-data-corruption checks; detection latency is uniform up to it."""
    spares: int | None = None
    """Hot spare nodes; None = the scheduler always has a replacement node at once."""
    planned_checkpoint: bool = True
    """Planned interruptions save a checkpoint first (no lost progress)."""
    straggler_per_day: float = 0.0
    """Straggler episodes (one slow GPU slowing the whole job) per day."""
    straggler_slowdown: float = 1.1
    """Step-time factor while a straggler is present."""
    straggler_catch_seconds: float = 1800.0
    """How long a straggler slows the job before it is caught and removed."""
    diurnal_swing: float = 0.015
    """Peak-to-trough throughput swing over a day (1-2% at Llama 3 scale)."""

    @property
    def startup_seconds(self) -> float:
        return self.restart_overhead_seconds - self.relaunch_seconds - self.restore_seconds

    @property
    def checkpoint_async_seconds(self) -> float:
        """Background part of a save, after the stall, before it is durable."""
        total = self.checkpoint_total_seconds
        return 0.0 if total is None else max(total - self.checkpoint_stall_seconds, 0.0)

    def with_(self, **changes: object) -> PolicyConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


def validate(job: JobConfig, policy: PolicyConfig, trials: int = 1) -> None:
    """Raise `UsageError` for absurd sizes and inconsistent policies."""
    if not 0 < job.gpus <= MAX_GPUS:
        raise UsageError(f"--gpus must be between 1 and {MAX_GPUS:,}, not {job.gpus}")
    if not (math.isfinite(job.days) and 0 < job.days <= MAX_DAYS):
        raise UsageError(f"--days must be above 0 and at most {MAX_DAYS:g}, not {job.days}")
    if not 0 < trials <= MAX_TRIALS:
        raise UsageError(f"--trials must be between 1 and {MAX_TRIALS:,}, not {trials}")
    if not (math.isfinite(job.step_seconds) and 1e-3 <= job.step_seconds <= 86400):
        # below a millisecond the interval arithmetic overflows (interval / step) and no real step is that short
        raise UsageError(f"--step-seconds must be between 0.001 and 86400, not {job.step_seconds}")
    for name in ("checkpoint_stall_seconds", "restart_overhead_seconds", "relaunch_seconds",
                 "restore_seconds", "crash_detection_seconds", "hang_timeout_seconds",
                 "sdc_check_seconds", "straggler_per_day", "straggler_catch_seconds", "diurnal_swing"):
        value = getattr(policy, name)
        if not (math.isfinite(value) and 0 <= value <= 1e8):
            raise UsageError(f"{name.replace('_', '-')} must be a non-negative number, not {value}")
    if policy.startup_seconds < 0:
        raise UsageError(
            f"--restart-overhead ({policy.restart_overhead_seconds:g} s) must cover relaunch "
            f"({policy.relaunch_seconds:g} s) and restore ({policy.restore_seconds:g} s)"
        )
    total = policy.checkpoint_total_seconds
    if total is not None and not (math.isfinite(total) and total >= policy.checkpoint_stall_seconds):
        raise UsageError("--checkpoint-total must be at least the checkpoint stall")
    if policy.spares is not None and not 0 <= policy.spares <= 100_000:
        raise UsageError(f"--spares must be between 0 and 100000, not {policy.spares}")
    if policy.straggler_slowdown < 1:
        raise UsageError("--straggler-slowdown must be at least 1")
    if policy.diurnal_swing >= 1:
        raise UsageError("diurnal swing must be below 1")


def parse_interval(text: str) -> str:
    """Validate an interval option: ``young``, ``daly`` or positive minutes."""
    t = text.strip().lower()
    if t in ("young", "daly", "auto"):
        return t
    try:
        minutes = float(t)
    except ValueError:
        raise UsageError(
            f"--checkpoint-interval must be minutes, 'young', 'daly' or 'auto', not {text!r}"
        ) from None
    if not (math.isfinite(minutes) and 0 < minutes <= 1e6):
        raise UsageError(f"--checkpoint-interval must be a positive number of minutes, not {text!r}")
    return t


def checkpoint_interval_seconds(policy: PolicyConfig, mtbf_seconds: float, step_seconds: float) -> float:
    """The interval of training time between saves, rounded to whole steps (at least one)."""
    cost = policy.checkpoint_stall_seconds
    if policy.interval in ("young", "auto"):
        raw = young_seconds(max(cost, step_seconds), mtbf_seconds)
    elif policy.interval == "daly":
        raw = daly_seconds(max(cost, step_seconds), mtbf_seconds)
    else:
        raw = float(policy.interval) * 60.0
    if not math.isfinite(raw):
        raw = 86400.0 * 365
    return max(round(raw / step_seconds), 1) * step_seconds
