"""The simulation page's data: the ETTR distribution over trials and the plan's ETTR-vs-interval curve.

A run written by ``trainguard simulate --events`` is one trial. Its page re-simulates the same
configuration, recovered from the run itself: model, size, horizon and seed from ``run_started``, the
checkpoint interval and stall from ``checkpoint_policy_changed``, save, restore and restart times
measured as ``trainguard plan --from-run`` does, detection latencies from ``failure_detected``. Only
built-in failure models are used (a run's events must not name a file for the server to read).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from trainguard.core.events import CheckpointPolicyChanged, FailureDetected, RunStarted
from trainguard.core.rundir import RunDir
from trainguard.errors import InputError, TrainguardError

TRIALS = 200
"""Trials of the ETTR distribution."""
PLAN_TRIALS = 100
"""Trials per candidate interval of the plan curve."""
MAX_SIMULATED_INTERRUPTIONS = 2_000_000
"""Interruptions one page may simulate in all (trials are reduced to stay under it): about a second here."""


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def recover_config(path: Path) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(model, JobConfig, PolicyConfig, inputs) of a simulated run; `InputError` when it is not one."""
    from trainguard.sim import JobConfig, PolicyConfig, builtin_models, load_model
    from trainguard.sim.calibrate import calibrate_from_run

    records = [item.record for item in RunDir(path).load()]
    started = next((e for e in records if isinstance(e, RunStarted)), None)
    config = started.config if started is not None else {}
    if started is None or config.get("simulator") != "trainguard.sim":
        raise InputError("not a run written by trainguard simulate --events")
    name = config.get("model")
    if not isinstance(name, str) or name not in builtin_models():
        raise InputError(f"failure model {name!r} is not a built-in model; re-simulate with trainguard simulate")
    model = load_model(name)
    cal = calibrate_from_run(path)
    policy_rec = next((e for e in records if isinstance(e, CheckpointPolicyChanged)), None)
    latency: dict[str, list[float]] = {"crash": [], "hang": [], "sdc": []}
    for e in records:
        if isinstance(e, FailureDetected) and e.kind in latency:
            latency[e.kind].append(e.detection_latency_seconds)
    defaults = PolicyConfig()

    def num(value: Any, default: float) -> float:
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 else default

    stall = num(policy_rec.save_cost_seconds if policy_rec else None, cal.checkpoint_stall_seconds or 60.0)
    relaunch = num(cal.relaunch_seconds, defaults.relaunch_seconds)
    restore = num(cal.restore_seconds, defaults.restore_seconds)
    sdc = max(latency["sdc"], default=None)
    interval_seconds = num(policy_rec.interval_seconds if policy_rec else None, 0.0)
    policy = PolicyConfig(
        interval=str(interval_seconds / 60.0) if interval_seconds > 0 else "young",
        checkpoint_stall_seconds=stall,
        checkpoint_total_seconds=max(num(cal.checkpoint_total_seconds, stall), stall),
        restart_overhead_seconds=max(num(cal.restart_overhead_seconds, defaults.restart_overhead_seconds),
                                     relaunch + restore),
        relaunch_seconds=relaunch,
        restore_seconds=restore,
        crash_detection_seconds=num(_median(latency["crash"]), defaults.crash_detection_seconds),
        hang_timeout_seconds=num(_median(latency["hang"]), defaults.hang_timeout_seconds),
        sdc_check_seconds=num(sdc, defaults.sdc_check_seconds),
    )
    job = JobConfig(gpus=started.world_size, days=num(config.get("days"), 0.0),
                    step_seconds=num(config.get("step_seconds"), cal.step_seconds or 10.0))
    seed = config.get("seed")
    inputs = {
        "model": model.name, "gpus": job.gpus, "days": job.days, "step_seconds": job.step_seconds,
        "seed": seed if isinstance(seed, int) and 0 <= seed < 2**63 else 0,
        "checkpoint_interval_minutes": float(policy.interval) if policy.interval != "young" else None,
        "checkpoint_stall_seconds": policy.checkpoint_stall_seconds,
        "checkpoint_total_seconds": policy.checkpoint_total_seconds,
        "restart_overhead_seconds": policy.restart_overhead_seconds,
        "relaunch_seconds": policy.relaunch_seconds, "restore_seconds": policy.restore_seconds,
        "crash_detection_seconds": policy.crash_detection_seconds,
        "hang_timeout_seconds": policy.hang_timeout_seconds, "sdc_check_seconds": policy.sdc_check_seconds,
    }
    return model, job, policy, inputs


def simulation_view(path: Path, this_run_ettr: float | None = None) -> dict[str, Any]:
    """The simulation page's document; ``{"available": False, "reason": ...}`` for runs it cannot redo."""
    import numpy as np  # imported only when the simulation page is asked for

    from trainguard.sim import simulate
    from trainguard.sim.errors import SimError
    from trainguard.sim.plan import best_interval
    from trainguard.sim.policy import validate

    try:
        model, job, policy, inputs = recover_config(path)
        per_trial = job.gpus * model.rate_per_gpu_hour * job.days * 24 + model.planned_per_day * job.days
        trials = max(2, min(TRIALS, int(MAX_SIMULATED_INTERRUPTIONS / max(per_trial, 1.0))))
        plan_trials = max(2, min(PLAN_TRIALS, trials))
        validate(job, policy, trials)
        seed = inputs["seed"]
        result = simulate(model, job, policy, trials=trials, seed=seed)
        plan = best_interval(model, job, policy, trials=plan_trials, seed=seed)
    except (TrainguardError, SimError) as exc:  # a run the simulator cannot redo is a page, not a crash
        return {"available": False, "reason": str(exc)}
    ettr = np.sort(result.ettr)
    return {
        "available": True,
        "inputs": inputs,
        "trials": trials,
        "interval_minutes": result.interval_seconds / 60.0,
        "ettr": {
            "values": [round(float(x), 6) for x in ettr],
            "mean": float(ettr.mean()),
            "p5": float(np.percentile(ettr, 5)),
            "p50": float(np.percentile(ettr, 50)),
            "p95": float(np.percentile(ettr, 95)),
        },
        "this_run_ettr": this_run_ettr,
        "plan": {"trials": plan_trials, **plan},
    }
