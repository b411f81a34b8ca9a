"""Planner: best interval vs the formulas, spares and budgets for a target, calibration from a run."""

from __future__ import annotations

import argparse
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


def _memory_tier_run(root: Path) -> Path:
    """A run with the memory tier (records as the checkpointer writes them): three restarts, restored from this
    node's memory (cold), a peer's replica (warm interpreters), and storage (cold)."""
    import json

    from trainguard.core import events as ev
    from trainguard.core.rundir import RunDir

    agent: list[ev.Event] = [ev.AttemptStarted(time=0.0, attempt=0)]
    ranks: list[ev.Event] = [ev.StepCompleted(time=1.0, attempt=0, rank=r, step=1, duration_seconds=0.5)
                             for r in (0, 1)]
    for r in (0, 1):
        ranks += [ev.CheckpointSaveStarted(time=2.0, attempt=0, rank=r, step=1),
                  ev.CheckpointSaveFinished(time=7.0, attempt=0, rank=r, step=1, blocking_seconds=2.0,
                                            total_seconds=5.0, path="/ckpt/step-1")]
        for k in range(3):
            ranks += [ev.CheckpointSaveStarted(time=8.0 + k, attempt=0, rank=r, step=2 + k, tier="memory"),
                      ev.CheckpointSaveFinished(time=8.3 + k, attempt=0, rank=r, step=2 + k, blocking_seconds=0.05,
                                                total_seconds=0.3, path="memory:own+peer:n1", tier="memory")]
    # (next attempt, restore tier, slowest rank's restore, detection to first step)
    t = 20.0
    for nxt, tier, seconds, gap in [(1, "memory", 0.6, 8.0), (2, "peer", 1.0, 4.0), (3, "", 3.0, 20.0)]:
        agent += [ev.FailureDetected(time=t, attempt=nxt - 1, kind="crash"),
                  ev.AttemptStarted(time=t + 1.0, attempt=nxt, recovery="restart")]
        ranks += [ev.CheckpointLoaded(time=t + gap - 0.1, attempt=nxt, rank=r, step=4, seconds=s, tier=tier,
                                      path="memory:own" if tier else "/ckpt/step-1")
                  for r, s in ((0, seconds - 0.2), (1, seconds))]
        ranks += [ev.StepCompleted(time=t + gap + 0.5, attempt=nxt, rank=r, step=5, duration_seconds=0.5)
                  for r in (0, 1)]
        t += 100.0
    run = RunDir(root).create()
    with run.writer("agent-n0") as w:
        w.write_all(agent)
    with run.writer("rank-0") as w:
        w.write_all(ranks)
    # attempt 2's ranks were warm interpreters: a field the agent's records carry (attempt_started.warm_starts)
    path = run.events_dir / "agent-n0.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in lines:
        if rec["type"] == "attempt_started" and rec["attempt"] == 2:
            rec["warm_starts"] = 2
    path.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    return root


def test_calibration_measures_the_memory_tier_and_warm_restarts_apart(tmp_path: Path) -> None:
    cal = calibrate_from_run(_memory_tier_run(tmp_path / "r"))
    assert cal.checkpoint_stall_seconds == pytest.approx(2.0)  # storage's saves only
    assert cal.checkpoint_total_seconds == pytest.approx(5.0)
    assert (cal.memory_stall_seconds, cal.memory_total_seconds) == (pytest.approx(0.05), pytest.approx(0.3))
    assert cal.memory_replicated is True
    assert cal.memory_restore_seconds == pytest.approx(0.5)  # median of the ranks' 0.4 and 0.6
    assert cal.peer_restore_seconds == pytest.approx(0.9)  # median of 0.8 and 1.0
    assert cal.restore_seconds == pytest.approx(2.9)  # storage: median of 2.8 and 3.0
    assert cal.memory_restart_seconds == pytest.approx(8.0)
    assert cal.warm_restart_seconds == pytest.approx(4.0) and cal.warm_start_seconds == pytest.approx(3.0)
    assert cal.restart_overhead_seconds == pytest.approx(20.0)  # the cold restart restored from storage
    assert cal.cold_start_seconds == pytest.approx((8.0 - 0.6 + 20.0 - 3.0) / 2)
    assert cal.samples["memory_saves"] == 6 and cal.samples["restarts"] == 1
    assert (cal.samples["memory_restarts"], cal.samples["warm_restarts"]) == (1, 1)


def _plan_args(*argv: str) -> argparse.Namespace:
    from trainguard.cli import plan

    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_plan_feeds_the_memory_tier_figures_into_the_recovery_model(tmp_path: Path) -> None:
    from trainguard.cli.plan import _apply_calibration, _sources

    cal = calibrate_from_run(_memory_tier_run(tmp_path / "r"))
    args = _plan_args("--hang-timeout", "60")
    sources = _sources(args, _apply_calibration(args, cal))
    assert args.memory_checkpoint == "peer"  # the copies were replicated
    assert args.checkpoint_stall == pytest.approx(0.05) and args.checkpoint_total == pytest.approx(0.3)
    assert args.memory_restore_seconds == pytest.approx(0.9)  # the slower of own memory and a peer's replica
    assert args.warm_start_seconds == pytest.approx(3.0)
    assert args.restart_overhead == pytest.approx(20.0)
    assert sources["memory_checkpoint"] == sources["memory_restore_seconds"] == "measured"
    assert sources["warm_start_seconds"] == sources["restart_overhead_seconds"] == "measured"
    assert sources["inprocess_restart_seconds"] == "default"

    # Without a restart restored from storage, the restart overhead is the measured start-up plus storage's restore.
    from dataclasses import replace

    args = _plan_args("--restore-seconds", "40")
    sources = _sources(args, _apply_calibration(args, replace(cal, restart_overhead_seconds=None,
                                                                restore_seconds=None)))
    assert args.restart_overhead == pytest.approx(cal.cold_start_seconds + 40.0)
    assert sources["restart_overhead_seconds"] == "derived" and sources["restore_seconds"] == "option"


def test_a_run_without_memory_tier_records_plans_as_before(tmp_path: Path) -> None:
    from trainguard.cli.plan import _apply_calibration, _sources

    policy = PolicyConfig(checkpoint_stall_seconds=12.0, checkpoint_total_seconds=40.0, restart_overhead_seconds=420.0,
                          relaunch_seconds=45.0, restore_seconds=95.0)
    write_trial(tmp_path / "r", load_model("llama3"), JobConfig(gpus=16384, days=5, step_seconds=7.5), policy, seed=4)
    cal = calibrate_from_run(tmp_path / "r")
    assert cal.memory_stall_seconds is cal.memory_restore_seconds is cal.warm_restart_seconds is None
    assert cal.memory_restart_seconds is None and cal.samples["memory_saves"] == 0
    args = _plan_args()
    sources = _sources(args, _apply_calibration(args, cal))
    assert (args.checkpoint_stall, args.checkpoint_total, args.restart_overhead) == (12.0, 40.0, 420.0)
    assert (args.memory_checkpoint, args.warm_start_seconds, args.memory_restore_seconds) == ("off", None, 5.0)
    assert {k for k, v in sources.items() if v == "measured"} == {
        "step_seconds", "checkpoint_stall_seconds", "checkpoint_total_seconds", "restart_overhead_seconds",
        "relaunch_seconds", "restore_seconds"}
