"""Planning on top of the simulator: best checkpoint interval, spares, and restart/stall budgets.

Every search reuses one seed, so all candidates see the same failures (common random numbers) and
their ETTR differences are not drowned by Monte Carlo noise.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from trainguard.core.interval_theory import daly_seconds, meta_ettr, young_seconds
from trainguard.sim.bisect import largest_passing
from trainguard.sim.engine import simulate
from trainguard.sim.models import FailureModel
from trainguard.sim.policy import JobConfig, PolicyConfig, checkpoint_interval_seconds
from trainguard.sim.recovery import job_failure_rate_per_second
from trainguard.sim.summary import mean_detection_seconds

_FACTORS = (0.25, 0.35, 0.5, 0.7, 0.85, 1.0, 1.2, 1.4, 2.0, 2.8, 4.0)


def _ettr(model: FailureModel, job: JobConfig, policy: PolicyConfig, trials: int, seed: int) -> tuple[float, float]:
    r = simulate(model, job, policy, trials=trials, seed=seed)
    err = float(r.ettr.std(ddof=1) / math.sqrt(trials)) if trials > 1 else 0.0
    return float(r.ettr.mean()), err


def _rate(model: FailureModel, job: JobConfig) -> float:
    return job.gpus * model.rate_per_gpu_hour / 3600.0 + model.planned_per_day / 86400.0


def best_interval(model: FailureModel, job: JobConfig, policy: PolicyConfig, *, trials: int = 200,
                  seed: int = 0) -> dict[str, Any]:
    """Simulated ETTR over intervals around Young's, next to Young, Daly and Meta's approximation."""
    rate = _rate(model, job)
    # Young and Daly use the unexpected failures only: planned stops save first and lose no work.
    job_rate = job_failure_rate_per_second(model, job, policy)  # replica groups: only job-wide failures roll back
    mtbf = math.inf if job_rate <= 0 else 1.0 / job_rate
    cost = policy.checkpoint_stall_seconds  # the whole-step rounding keeps the interval at least one step
    young = young_seconds(cost, mtbf) if math.isfinite(mtbf) else 86400.0
    daly = daly_seconds(cost, mtbf) if math.isfinite(mtbf) else 86400.0
    u0 = mean_detection_seconds(model, policy) + policy.restart_overhead_seconds
    grid = np.geomspace(job.step_seconds, max(4 * young, 2 * job.step_seconds), 400)
    meta_vals = [meta_ettr(rate, u0, float(t), policy.checkpoint_stall_seconds) for t in grid]
    meta_best = float(grid[int(np.argmax(meta_vals))])
    seconds = sorted({checkpoint_interval_seconds(policy.with_(interval=str(v / 60.0)), mtbf, job.step_seconds)
                      for v in [young * f for f in _FACTORS] + [daly, meta_best]})
    rows = []
    for s in seconds:
        mean, err = _ettr(model, job, policy.with_(interval=str(s / 60.0)), trials, seed)
        rows.append({"minutes": s / 60.0, "ettr_mean": mean, "ettr_stderr": err,
                     "meta_ettr": meta_ettr(rate, u0, s, policy.checkpoint_stall_seconds)})
    best = max(rows, key=lambda r: r["ettr_mean"])
    return {
        "young_minutes": young / 60.0,
        "daly_minutes": daly / 60.0,
        "meta_optimal_minutes": meta_best / 60.0,
        "best_minutes": best["minutes"],
        "best_ettr": best["ettr_mean"],
        "mttf_hours": mtbf / 3600.0,
        "mtbi_hours": math.inf if rate <= 0 else 1.0 / rate / 3600.0,
        "u0_seconds": u0,
        "candidates": rows,
    }


def with_repair_hours(model: FailureModel, hours: float) -> FailureModel:
    """The model with every category's repair time set to ``hours``."""
    return replace(model, categories=tuple(replace(c, repair_hours=hours) for c in model.categories))


def spares_for_target(model: FailureModel, job: JobConfig, policy: PolicyConfig, target: float, *,
                      trials: int = 200, seed: int = 0, max_spares: int = 4096) -> dict[str, Any]:
    """Fewest hot spare nodes whose mean simulated ETTR reaches ``target`` (None if unlimited cannot)."""
    unlimited, _ = _ettr(model, job, policy.with_(spares=None), trials, seed)
    out: dict[str, Any] = {"target_ettr": target, "ettr_unlimited": unlimited, "needed": None, "ettr_with": None}
    if unlimited < target:
        return out
    lo, hi = -1, 0
    cache: dict[int, float] = {}

    def ok(n: int) -> bool:
        cache[n] = _ettr(model, job, policy.with_(spares=n), trials, seed)[0]
        return cache[n] >= target

    while not ok(hi):
        lo, hi = hi, max(1, hi * 2)
        if hi > max_spares:
            return out
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    out["needed"] = hi
    out["ettr_with"] = cache[hi]
    return out


def budgets_for_target(model: FailureModel, job: JobConfig, policy: PolicyConfig, target: float, *,
                       trials: int = 200, seed: int = 0) -> dict[str, Any]:
    """Largest restart overhead (at the given stall) and stall (at the given overhead) that reach ``target``."""
    floor = policy.relaunch_seconds + policy.restore_seconds

    def restart_ok(x: float) -> bool:
        return _ettr(model, job, policy.with_(restart_overhead_seconds=x), trials, seed)[0] >= target

    def stall_ok(x: float) -> bool:
        total = policy.checkpoint_total_seconds
        p = policy.with_(checkpoint_stall_seconds=x, checkpoint_total_seconds=None if total is None else max(total, x))
        return _ettr(model, job, p, trials, seed)[0] >= target

    return {
        "target_ettr": target,
        "max_restart_overhead_seconds": largest_passing(restart_ok, floor, 4 * 3600.0),
        "at_checkpoint_stall_seconds": policy.checkpoint_stall_seconds,
        "max_checkpoint_stall_seconds": largest_passing(stall_ok, 0.0, 3600.0),
        "at_restart_overhead_seconds": policy.restart_overhead_seconds,
    }


def best_interval_policy(model: FailureModel, job: JobConfig, policy: PolicyConfig, *, trials: int = 100,
                         seed: int = 0) -> PolicyConfig:
    """The policy with its interval replaced by the interval of best simulated ETTR (``simulate
    --checkpoint-interval best``)."""
    best = best_interval(model, job, policy, trials=trials, seed=seed)
    return policy.with_(interval=str(best["best_minutes"]))
