"""Planner: best interval vs the formulas, spares and budgets for a target, calibration from a run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainguard.interval_theory import daly_seconds, young_seconds
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
