"""Planner: best interval vs the formulas, spares and budgets for a target, calibration from a run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainguard.core.interval_theory import daly_seconds, young_seconds
from trainguard.sim.calibrate import calibrate_from_run
from trainguard.sim.engine import simulate
from trainguard.sim.events_out import write_trial
from trainguard.sim.models import load_model, parse_model
from trainguard.sim.plan import best_interval, budgets_for_target, spares_for_target, with_repair_hours
from trainguard.sim.policy import JobConfig, PolicyConfig


def test_young_and_daly_match_the_reference_figures() -> None:
    m = 3.09 * 3600
    assert young_seconds(60, m) / 60 == pytest.approx(19.3, abs=0.05)
    assert daly_seconds(60, m) / 60 == pytest.approx(18.6, abs=0.05)
    assert daly_seconds(100, 40) == 40


def test_best_interval_is_near_young_when_failures_are_rare() -> None:
    model = parse_model({"failure": [{"category": "Faulty GPU", "rate_per_node_day": 0.004, "repair": "restart"}]})
    job = JobConfig(gpus=16384, days=20)
    out = best_interval(model, job, PolicyConfig(), trials=100, seed=1)
    assert 0.5 < out["best_minutes"] / out["young_minutes"] < 2.0
    young_row = min(out["candidates"], key=lambda r: abs(r["minutes"] - out["young_minutes"]))
    assert out["best_ettr"] >= young_row["ettr_mean"]
    assert all(out["best_ettr"] >= r["ettr_mean"] for r in out["candidates"])
    assert out["meta_optimal_minutes"] == pytest.approx(out["young_minutes"], rel=0.35)


def test_spares_needed_is_the_smallest_that_reaches_the_target() -> None:
    model = with_repair_hours(load_model("llama3"), 72)
    job = JobConfig(gpus=16384, days=10)
    policy = PolicyConfig()
    unlimited = simulate(model, job, policy, trials=40, seed=2).ettr.mean()
    target = unlimited - 0.01
    out = spares_for_target(model, job, policy, target, trials=40, seed=2)
    n = out["needed"]
    assert n is not None and n > 0 and out["ettr_with"] >= target
    assert simulate(model, job, policy.with_(spares=n - 1), trials=40, seed=2).ettr.mean() < target
    assert spares_for_target(model, job, policy, unlimited + 0.01, trials=40, seed=2)["needed"] is None


def test_budgets_reach_the_target_and_no_more() -> None:
    model = load_model("llama3")
    job = JobConfig(gpus=16384, days=10)
    policy = PolicyConfig(interval="20")
    target = 0.85
    out = budgets_for_target(model, job, policy, target, trials=40, seed=2)
    x = out["max_restart_overhead_seconds"]
    assert x is not None and 180 <= x < 600

    def ettr(p: PolicyConfig) -> float:
        return float(simulate(model, job, p, trials=40, seed=2).ettr.mean())

    assert ettr(policy.with_(restart_overhead_seconds=x)) >= target
    assert ettr(policy.with_(restart_overhead_seconds=x * 1.05)) < target
    s = out["max_checkpoint_stall_seconds"]
    assert s is not None and ettr(policy.with_(checkpoint_stall_seconds=s)) >= target
    assert ettr(policy.with_(checkpoint_stall_seconds=s * 1.1 + 1)) < target
    assert budgets_for_target(model, job, policy, 0.999, trials=10, seed=2)["max_restart_overhead_seconds"] is None


def test_calibration_recovers_the_inputs_of_a_simulated_run(tmp_path: Path) -> None:
    policy = PolicyConfig(checkpoint_stall_seconds=12.0, checkpoint_total_seconds=40.0, restart_overhead_seconds=420.0,
                          relaunch_seconds=45.0, restore_seconds=95.0)
    write_trial(tmp_path / "r", load_model("llama3"), JobConfig(gpus=16384, days=5, step_seconds=7.5), policy, seed=4)
    cal = calibrate_from_run(tmp_path / "r")
    assert cal.step_seconds == pytest.approx(7.5)
    assert cal.checkpoint_stall_seconds == pytest.approx(12.0)
    assert cal.checkpoint_total_seconds == pytest.approx(40.0)
    assert cal.restore_seconds == pytest.approx(95.0)
    assert cal.relaunch_seconds == pytest.approx(45.0)
    assert cal.restart_overhead_seconds == pytest.approx(420.0)
    assert cal.samples["restarts"] > 10 and math.isfinite(cal.samples["steps"])


def test_calibration_measures_inprocess_restarts_apart(tmp_path: Path) -> None:
    """Attempts opened by an in-process restart are timed apart from full restarts, and the in-process
    outcomes give the share that did not fall back (records of the supervisor's in-process path)."""
    from trainguard.core import events as ev
    from trainguard.core.rundir import RunDir

    out: list[ev.Event] = [ev.AttemptStarted(time=0.0, attempt=0)]
    t = 0.0
    # attempt k fails at t+100; the next attempt's first step starts 2 s later (in-process) or 9 s later (full)
    for k, (path, gap) in enumerate([("in-process", 2.0), ("restart", 9.0), ("in-process", 3.0),
                                     ("in-process", 4.0), ("restart", 11.0)]):
        out.append(ev.StepCompleted(time=t + 1.0, attempt=k, rank=0, step=1, duration_seconds=1.0))
        t += 100.0
        out.append(ev.FailureDetected(time=t, attempt=k, kind="crash"))
        out.append(ev.AttemptStarted(time=t + gap / 2, attempt=k + 1, recovery=path))
        if path == "in-process":
            out.append(ev.InProcessRecovery(time=t + gap / 2, attempt=k + 1, status="recovered", seconds=gap / 2))
        t += gap
        out.append(ev.StepCompleted(time=t + 1.0, attempt=k + 1, rank=0, step=2, duration_seconds=1.0))
    out.append(ev.InProcessRecovery(time=t + 5, attempt=9, status="fallback"))
    with RunDir(tmp_path / "r").create().writer("agent-x") as writer:
        writer.write_all(out)
    cal = calibrate_from_run(tmp_path / "r")
    assert cal.inprocess_restart_seconds == pytest.approx(3.0)  # median of 2, 3, 4
    assert cal.restart_overhead_seconds == pytest.approx(10.0)  # median of 9, 11
    assert cal.inprocess_share == pytest.approx(3 / 4)
    assert cal.samples["inprocess_restarts"] == 3 and cal.samples["restarts"] == 2
