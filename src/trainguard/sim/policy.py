"""Job and recovery-policy configuration for the simulator, and how the checkpoint interval is resolved.

Both configs validate themselves (`SimConfigError` naming the field); Young and Daly come from
`trainguard.core.interval_theory`, shared with the checkpointer, so ``auto`` means the same everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trainguard.core.interval_theory import AUTO_FORMULA, daly_seconds, young_seconds
from trainguard.core.numeric import in_range
from trainguard.sim.errors import SimConfigError

MAX_GPUS = 10_000_000
MAX_DAYS = 3650.0
MAX_TRIALS = 1_000_000
MAX_SECONDS = 1e8
"""Largest duration any policy field accepts (about three years)."""
MAX_REPLICA_GROUPS = 1_000_000
INTERVAL_WORDS = ("young", "daly", "auto")
"""Named intervals; ``auto`` is `interval_theory.AUTO_FORMULA` (Daly), as in the checkpointer."""
MEMORY_CHECKPOINT = ("off", "local", "peer")

_DURATIONS = ("checkpoint_stall_seconds", "restart_overhead_seconds", "relaunch_seconds", "restore_seconds",
              "crash_detection_seconds", "hang_timeout_seconds", "sdc_check_seconds", "straggler_per_day",
              "straggler_catch_seconds", "diurnal_swing", "inprocess_restart_seconds",
              "group_reconfigure_seconds")


def _finite_in(field: str, value: float, low: float, high: float) -> None:
    if not in_range(value, low, high):
        raise SimConfigError(field, f"must be a number between {low:g} and {high:g}, not {value!r}")


@dataclass(frozen=True)
class JobConfig:
    """The simulated job."""

    gpus: int = 16384
    """Number of GPUs the synchronous job needs (a multiple of the model's GPUs per node is not required)."""
    days: float = 54.0
    """Wall-clock horizon of each trial."""
    step_seconds: float = 10.0
    """Time of one training step when nothing goes wrong."""

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or not 0 < self.gpus <= MAX_GPUS:
            raise SimConfigError("gpus", f"must be between 1 and {MAX_GPUS:,}, not {self.gpus}")
        if not (math.isfinite(self.days) and 0 < self.days <= MAX_DAYS):
            raise SimConfigError("days", f"must be above 0 and at most {MAX_DAYS:g}, not {self.days}")
        # below a millisecond the interval arithmetic overflows (interval / step) and no real step is that short
        _finite_in("step_seconds", self.step_seconds, 1e-3, 86400.0)


@dataclass(frozen=True)
class PolicyConfig:
    """How the job checkpoints and recovers."""

    interval: str = "young"
    """``young``, ``daly``, ``auto`` (= Daly, as in the checkpointer) or a number of minutes (as text),
    resolved by `checkpoint_interval_seconds`."""
    checkpoint_stall_seconds: float = 60.0
    """Time training stops for each save (the blocking part; async staging for async saves)."""
    checkpoint_total_seconds: float | None = None
    """From a save's start until it is durable (None: same as the stall, i.e. a synchronous save)."""
    restart_overhead_seconds: float = 600.0
    """From failure detection to the first new step of a full restart: relaunch + startup + restore."""
    relaunch_seconds: float = 60.0
    """The part of the overhead before workers start (teardown, rescheduling, node swap)."""
    restore_seconds: float = 120.0
    """The part of the overhead spent loading the checkpoint from storage."""
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
    inprocess_share: float = 0.0
    """Share of unexpected failures recovered by an in-process restart (surviving ranks re-create the
    process group in the same interpreter); the rest fall back to a full restart."""
    inprocess_restart_seconds: float = 30.0
    """Detection to the first new step of an in-process recovery, its restore included."""
    warm_start_seconds: float | None = None
    """With warm spare processes (torch and the script already imported, already scheduled): a full
    restart's relaunch + startup take this instead; None = cold restarts."""
    memory_checkpoint: str = "off"
    """In-memory checkpoints: ``off``; ``local`` (host RAM: restore from memory when the failed node
    survived, i.e. repair ``restart``); ``peer`` (also a peer's copy: any GPU- or host-scope failure)."""
    memory_restore_seconds: float = 5.0
    """Restore from host memory or a peer's copy (used instead of ``restore_seconds`` when it applies)."""
    replica_groups: int = 1
    """Fault-tolerant HSDP replica groups (as in torchft); 1 = off. With G > 1 a GPU- or host-scope
    failure takes only its group out: the others keep training at (G-1)/G throughput until it rejoins."""
    group_reconfigure_seconds: float = 5.0
    """With replica groups: the survivors' pause to agree on the new quorum after a group drops out."""

    def __post_init__(self) -> None:
        for name in _DURATIONS:
            _finite_in(name, getattr(self, name), 0.0, MAX_SECONDS)
        if self.startup_seconds < 0:
            raise SimConfigError(
                "restart_overhead_seconds",
                f"({self.restart_overhead_seconds:g} s) must cover relaunch ({self.relaunch_seconds:g} s) "
                f"and restore ({self.restore_seconds:g} s)")
        total = self.checkpoint_total_seconds
        if total is not None and not (math.isfinite(total) and self.checkpoint_stall_seconds <= total <= MAX_SECONDS):
            raise SimConfigError("checkpoint_total_seconds", f"must be at least the checkpoint stall, not {total}")
        if self.spares is not None and not 0 <= self.spares <= 100_000:
            raise SimConfigError("spares", f"must be between 0 and 100000, not {self.spares}")
        _finite_in("straggler_slowdown", self.straggler_slowdown, 1.0, 1e6)
        if self.diurnal_swing >= 1:
            raise SimConfigError("diurnal_swing", f"must be below 1, not {self.diurnal_swing}")
        _finite_in("inprocess_share", self.inprocess_share, 0.0, 1.0)
        if self.warm_start_seconds is not None:
            _finite_in("warm_start_seconds", self.warm_start_seconds, 0.0, MAX_SECONDS)
        if self.memory_checkpoint not in MEMORY_CHECKPOINT:
            raise SimConfigError("memory_checkpoint",
                                 f"must be one of {', '.join(MEMORY_CHECKPOINT)}, not {self.memory_checkpoint!r}")
        _finite_in("memory_restore_seconds", self.memory_restore_seconds, 0.0, MAX_SECONDS)
        if isinstance(self.replica_groups, bool) or not isinstance(self.replica_groups, int) or not (
                1 <= self.replica_groups <= MAX_REPLICA_GROUPS):
            raise SimConfigError("replica_groups",
                                 f"must be between 1 and {MAX_REPLICA_GROUPS:,}, not {self.replica_groups}")
        parse_interval(self.interval)

    @property
    def startup_seconds(self) -> float:
        """Process start-up of a cold full restart: the overhead less relaunch and restore."""
        return self.restart_overhead_seconds - self.relaunch_seconds - self.restore_seconds

    @property
    def checkpoint_async_seconds(self) -> float:
        """Background part of a save, after the stall, before it is durable."""
        total = self.checkpoint_total_seconds
        return 0.0 if total is None else max(total - self.checkpoint_stall_seconds, 0.0)

    def with_(self, **changes: object) -> PolicyConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


def validate(job: JobConfig, policy: PolicyConfig, trials: int = 1) -> None:
    """Check what the configs cannot check alone (the trial count); they validate themselves."""
    del job, policy  # validated on construction; kept in the signature for callers that pass them
    if isinstance(trials, bool) or not isinstance(trials, int) or not 0 < trials <= MAX_TRIALS:
        raise SimConfigError("trials", f"must be between 1 and {MAX_TRIALS:,}, not {trials}")


def validate_seed(seed: int) -> None:
    """Seeds feed numpy's SeedSequence, which takes non-negative integers below 2**63 here."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise SimConfigError("seed", f"must be between 0 and 2**63-1, not {seed}")


def parse_interval(text: str) -> str:
    """Validate an interval: ``young``, ``daly``, ``auto`` or positive minutes (returned normalized)."""
    t = text.strip().lower()
    if t in INTERVAL_WORDS:
        return t
    try:
        minutes = float(t)
    except ValueError:
        raise SimConfigError("interval", f"must be minutes, 'young', 'daly' or 'auto', not {text!r}") from None
    if not (math.isfinite(minutes) and 0 < minutes <= 1e6):
        raise SimConfigError("interval", f"must be a positive number of minutes, not {text!r}")
    return t


def checkpoint_interval_seconds(policy: PolicyConfig, mtbf_seconds: float, step_seconds: float) -> float:
    """The interval of training time between saves, rounded to whole steps (at least one)."""
    cost = policy.checkpoint_stall_seconds  # rounded to whole steps below: at least one step
    word = AUTO_FORMULA if policy.interval == "auto" else policy.interval
    if word == "young":
        raw = young_seconds(cost, mtbf_seconds)
    elif word == "daly":
        raw = daly_seconds(cost, mtbf_seconds)
    else:
        raw = float(policy.interval) * 60.0
    if not math.isfinite(raw):
        raw = 86400.0 * 365
    return max(round(raw / step_seconds), 1) * step_seconds
