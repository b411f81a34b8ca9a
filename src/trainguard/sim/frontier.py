"""The frontier for a target ETTR: per recovery scheme, the loosest (checkpoint stall, restart time)
pairs that still reach it, so a planner sees every way to the target instead of one knob at a time.

Each scheme's frontier is found on one set of draws (common random numbers): for each stall on a grid,
the largest restart time that reaches the target, by bisection in log space; dominated pairs are dropped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from trainguard.accounting.goodput import BUCKETS
from trainguard.sim.bisect import largest_passing
from trainguard.sim.engine import Sample, account, interval_seconds_for, samples, straggler_seconds
from trainguard.sim.errors import SimConfigError
from trainguard.sim.models import FailureModel
from trainguard.sim.policy import JobConfig, PolicyConfig, validate, validate_seed

log = logging.getLogger(__name__)

SCHEMES = ("restart", "inprocess", "replica-groups")
"""Recovery schemes the frontier compares (docs/simulation.md)."""
STALL_GRID_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Checkpoint stalls tried: from an in-memory copy (under a second) to a slow synchronous save."""
MIN_RESTART_SECONDS = 0.5
MAX_RESTART_SECONDS = 4 * 3600.0
_BISECTIONS = 12
"""Log-space bisection over [0.5 s, 4 h]: each step halves the log ratio, 12 steps give about 0.2%."""


@dataclass(frozen=True)
class FrontierConfig:
    """What the frontier search varies and how finely."""

    target_ettr: float = 0.9
    """Mean simulated ETTR each frontier point must reach."""
    inprocess_share: float = 0.9
    """Share of unexpected failures an in-process restart recovers in the ``inprocess`` schemes."""
    replica_groups: int = 8
    """Replica groups of the ``replica-groups`` schemes."""
    schemes: tuple[str, ...] = SCHEMES
    """Schemes to search, a subset of `SCHEMES`."""
    stalls_seconds: tuple[float, ...] = STALL_GRID_SECONDS
    """Checkpoint stalls at which the largest admissible restart time is searched."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.target_ettr) and 0 < self.target_ettr < 1):
            raise SimConfigError("target_ettr", f"must be between 0 and 1, not {self.target_ettr}")
        if not (math.isfinite(self.inprocess_share) and 0 < self.inprocess_share <= 1):
            raise SimConfigError("inprocess_share", f"must be above 0 and at most 1, not {self.inprocess_share}")
        if not 2 <= self.replica_groups <= 1_000_000:
            raise SimConfigError("replica_groups", f"must be between 2 and 1,000,000, not {self.replica_groups}")
        unknown = [s for s in self.schemes if s not in SCHEMES]
        if unknown or not self.schemes:
            raise SimConfigError("schemes", f"must be among {', '.join(SCHEMES)}, not {unknown or 'none'}")
        if not self.stalls_seconds or any(not (math.isfinite(s) and s >= 0) for s in self.stalls_seconds):
            raise SimConfigError("stalls_seconds", "must be non-negative numbers")


@dataclass(frozen=True)
class FrontierPoint:
    """One Pareto-minimal requirement: a save stalling at most this long and a restart at most this long."""

    scheme: str
    checkpoint_stall_seconds: float
    restart_seconds: float
    """Detection to first step of the scheme's own recovery path (see `scheme_policy`)."""
    ettr: float
    """Mean simulated ETTR at exactly this point (at least the target)."""
    interval_minutes: float
    """Checkpoint interval the point was simulated with."""

    def to_json(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "checkpoint_stall_seconds": self.checkpoint_stall_seconds,
                "restart_seconds": self.restart_seconds, "ettr": self.ettr, "interval_minutes": self.interval_minutes}


@dataclass(frozen=True)
class Frontier:
    """The frontier of every scheme searched; empty points mean the target is out of that scheme's reach."""

    config: FrontierConfig
    points: tuple[FrontierPoint, ...]
    best_ettr: dict[str, float] = field(default_factory=dict)
    """Per scheme, the ETTR at the grid's best corner (shortest stall, 0.5 s restarts)."""
    corner_badput: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per scheme, the badput fractions at that corner: what stands between it and the target."""
    detection_scale: dict[str, float | None] = field(default_factory=dict)
    """Per unreachable scheme, the largest factor f such that all detection latencies at f times the
    policy's let the corner reach the target (None: not even instant detection does)."""

    @property
    def reachable(self) -> bool:
        return bool(self.points)


def scheme_policy(base: PolicyConfig, scheme: str, restart_seconds: float, stall_seconds: float,
                  config: FrontierConfig) -> PolicyConfig:
    """The base policy with a scheme's recovery and the given restart time and stall.

    ``restart``: every failure takes a full restart of ``restart_seconds`` (relaunch and restore keep
    the base policy's proportions). ``inprocess``: a share of failures recover in process in
    ``restart_seconds``; the rest take the base policy's full restart. ``replica-groups``: a failed
    group restarts in ``restart_seconds`` while the others train on; job-wide failures restart the job
    in the same time.
    """
    total = base.checkpoint_total_seconds
    p = base.with_(checkpoint_stall_seconds=stall_seconds,
                   checkpoint_total_seconds=None if total is None else max(total, stall_seconds),
                   warm_start_seconds=None, memory_checkpoint="off", inprocess_share=0.0, replica_groups=1)
    if scheme == "inprocess":
        p = p.with_(inprocess_share=config.inprocess_share, inprocess_restart_seconds=restart_seconds)
    else:
        frac = base.restart_overhead_seconds or 1.0
        relaunch = restart_seconds * base.relaunch_seconds / frac
        p = p.with_(restart_overhead_seconds=restart_seconds, relaunch_seconds=relaunch,
                    # never above what is left, so rounding cannot make start-up negative
                    restore_seconds=max(0.0, min(restart_seconds * base.restore_seconds / frac,
                                                 restart_seconds - relaunch)),
                    replica_groups=config.replica_groups if scheme == "replica-groups" else 1)
    return p


Evaluation = tuple[float, float, dict[str, float]]
"""Mean ETTR, checkpoint interval (seconds) and mean badput fraction per bucket."""


class Evaluator(Protocol):
    """Evaluates a policy on cached draws, optionally with every detection latency scaled."""

    def __call__(self, policy: PolicyConfig, detection_scale: float = 1.0) -> Evaluation: ...


def ettr_evaluator(model: FailureModel, job: JobConfig, base: PolicyConfig, *, trials: int,
                   seed: int) -> Evaluator:
    """(mean ETTR, interval seconds, badput fractions) of any recovery policy on one cached set of draws.

    The draws depend only on the failure model, detection, spares and stragglers, never on restart
    times, stalls or the recovery scheme, so they are sampled once: the same numbers `simulate` gives
    with this seed. Every detection latency (crash, hang, a category's fixed one, and the uniform SDC
    latency) is linear in its setting, so ``detection_scale`` f gives exactly the draws of a policy
    whose detection settings are all f times the base's.
    """
    validate(job, base, trials)
    validate_seed(seed)
    cached: list[Sample] = list(samples(model, job, base, trials, seed))
    horizon = job.days * 86400.0

    def ettr(policy: PolicyConfig, detection_scale: float = 1.0) -> Evaluation:
        tau = interval_seconds_for(model, job, policy)
        kept = 0.0
        lost = dict.fromkeys(BUCKETS, 0.0)
        for smp in cached:
            if detection_scale != 1.0:
                smp = replace(smp, detection=smp.detection * detection_scale)
            acc = account(smp, model, job, policy, tau)
            straggler = straggler_seconds(smp, policy, acc.productive)
            kept += float((acc.productive - straggler).sum())
            for b in BUCKETS:
                lost[b] += float(straggler.sum() if b == "straggler" else acc.buckets[b].sum())
        scale = 1.0 / (trials * horizon)
        return kept * scale, tau, {b: v * scale for b, v in lost.items()}

    return ettr


def _max_restart(ok: Callable[[float], bool]) -> float | None:
    """Largest restart time in [MIN, MAX] for which ``ok`` holds (monotone: true below, false above)."""
    return largest_passing(ok, MIN_RESTART_SECONDS, MAX_RESTART_SECONDS, iterations=_BISECTIONS, log_scale=True)


def pareto(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """Drop every point whose requirement is tighter than another's in both stall and restart time."""
    keep = []
    for p in points:
        dominated = any(
            q is not p and q.checkpoint_stall_seconds >= p.checkpoint_stall_seconds
            and q.restart_seconds >= p.restart_seconds
            and (q.checkpoint_stall_seconds, q.restart_seconds) != (p.checkpoint_stall_seconds, p.restart_seconds)
            for q in points)
        if not dominated:
            keep.append(p)
    return sorted(keep, key=lambda p: p.checkpoint_stall_seconds)


def _scheme_frontier(evaluate: Evaluator, base: PolicyConfig, scheme: str,
                     config: FrontierConfig) -> tuple[list[FrontierPoint], Evaluation]:
    stalls = sorted(config.stalls_seconds)
    corner = evaluate(scheme_policy(base, scheme, MIN_RESTART_SECONDS, stalls[0], config))
    points: list[FrontierPoint] = []
    for stall in stalls:

        def ok(restart: float, stall: float = stall) -> bool:
            return evaluate(scheme_policy(base, scheme, restart, stall, config))[0] >= config.target_ettr

        restart = _max_restart(ok)
        if restart is None:
            break  # a longer stall only costs more: no larger stall reaches the target either
        ettr, tau, _ = evaluate(scheme_policy(base, scheme, restart, stall, config))
        points.append(FrontierPoint(scheme, stall, restart, ettr, tau / 60.0))
    return pareto(points), corner


def find_frontier(model: FailureModel, job: JobConfig, base: PolicyConfig, config: FrontierConfig, *,
                  trials: int = 200, seed: int = 0) -> Frontier:
    """Every scheme's Pareto-minimal (stall, restart time) requirements that reach ``config.target_ettr``."""
    evaluate = ettr_evaluator(model, job, base, trials=trials, seed=seed)
    points: list[FrontierPoint] = []
    best: dict[str, float] = {}
    badput: dict[str, dict[str, float]] = {}
    detection: dict[str, float | None] = {}
    for scheme in config.schemes:
        found, (best[scheme], _, badput[scheme]) = _scheme_frontier(evaluate, base, scheme, config)
        log.info("frontier %s: %d points (ETTR at the grid's best corner %.4f)", scheme, len(found), best[scheme])
        points.extend(found)
        if not found:
            detection[scheme] = _detection_scale(evaluate, base, scheme, config)
    return Frontier(config=config, points=tuple(points), best_ettr=best, corner_badput=badput,
                    detection_scale=detection)


def _detection_scale(evaluate: Evaluator, base: PolicyConfig, scheme: str, config: FrontierConfig) -> float | None:
    """Largest f in [0, 1] with which the scheme's best corner reaches the target (bisection, 1/4096)."""
    corner = scheme_policy(base, scheme, MIN_RESTART_SECONDS, min(config.stalls_seconds), config)

    def ok(f: float) -> bool:
        return evaluate(corner, detection_scale=f)[0] >= config.target_ettr

    # Only schemes whose corner misses the target at f = 1 come here: 1 is not tried again.
    return largest_passing(ok, 0.0, 1.0, iterations=_BISECTIONS, hi_fails=True)


def frontier_json(frontier: Frontier) -> dict[str, Any]:
    """The ``frontier`` object of ``trainguard plan --json`` (schema in docs/simulation.md)."""
    c = frontier.config
    return {
        "target_ettr": c.target_ettr,
        "reachable": frontier.reachable,
        "inprocess_share": c.inprocess_share,
        "replica_groups": c.replica_groups,
        "stalls_seconds": list(c.stalls_seconds),
        "restart_range_seconds": [MIN_RESTART_SECONDS, MAX_RESTART_SECONDS],
        "best_ettr": frontier.best_ettr,
        "corner_badput_fraction": frontier.corner_badput,
        "detection_scale": frontier.detection_scale,
        "points": [p.to_json() for p in frontier.points],
    }

