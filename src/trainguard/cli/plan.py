"""``trainguard plan``: checkpoint interval, spares and restart/stall budgets for a target ETTR."""

from __future__ import annotations

import argparse
import logging
import math
from typing import Any

from trainguard.errors import EXIT_OK, UsageError

log = logging.getLogger(__name__)

HELP = "plan checkpoint interval, hot spares and restart budgets for a large job (simulation-based)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from trainguard.cli.simulate import add_job_arguments

    parser.add_argument("--trials", type=int, default=200, help="trials per evaluated configuration (default 200)")
    parser.add_argument("--target-ettr", type=float, default=0.9, help="ETTR to reach (default 0.9)")
    parser.add_argument("--repair-hours", type=float, default=None,
                        help="override every failure category's repair time (for the spares search)")
    parser.add_argument("--from-run", metavar="RUN_DIR",
                        help="calibrate step time, save cost and restart overhead from a run's events")
    parser.add_argument("--json", action="store_true", help="print one JSON document (docs/simulation.md)")
    add_job_arguments(parser)


MAX_CALIBRATED_SECONDS = 7 * 86400.0
"""Longest step, save, restore or restart believed from a run's events; beyond it a figure is corrupt."""
MIN_CALIBRATED_STEP_SECONDS = 1e-3
"""Shortest step time believed from a run's events (no training step of a large job takes under 1 ms)."""


def _plausible_calibration(cal: Any) -> Any:
    """The calibration with figures no real run produces (negative, not finite, over a week, a step
    under 1 ms) dropped with a warning, so one corrupt record cannot turn into a bad option (exit 2)."""
    from dataclasses import replace

    dropped: dict[str, Any] = {}
    for name in ("step_seconds", "checkpoint_stall_seconds", "checkpoint_total_seconds", "restore_seconds",
                 "relaunch_seconds", "restart_overhead_seconds"):
        value = getattr(cal, name)
        if value is None:
            continue
        low_ok = value >= MIN_CALIBRATED_STEP_SECONDS if name == "step_seconds" else value >= 0
        if not (math.isfinite(value) and low_ok and value <= MAX_CALIBRATED_SECONDS):
            log.warning("calibration from %s: %s = %g is implausible; the option's value is used instead",
                        cal.run, name, value)
            dropped[name] = None
    return replace(cal, **dropped) if dropped else cal


def _apply_calibration(args: argparse.Namespace, cal: Any) -> None:
    """Measured figures replace the corresponding options."""
    if cal.step_seconds:
        args.step_seconds = cal.step_seconds
    if cal.checkpoint_stall_seconds is not None:
        args.checkpoint_stall = cal.checkpoint_stall_seconds
    if cal.checkpoint_total_seconds is not None:
        args.checkpoint_total = max(cal.checkpoint_total_seconds, args.checkpoint_stall)
    if cal.restore_seconds is not None:
        args.restore_seconds = cal.restore_seconds
    if cal.relaunch_seconds is not None:
        args.relaunch_seconds = cal.relaunch_seconds
    if cal.restart_overhead_seconds is not None:
        args.restart_overhead = cal.restart_overhead_seconds
    args.restart_overhead = max(args.restart_overhead, args.relaunch_seconds + args.restore_seconds)


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.output import Progress, print_json
    from trainguard.cli.simulate import job_from_args
    from trainguard.sim.calibrate import calibrate_from_run
    from trainguard.sim.plan import best_interval, budgets_for_target, spares_for_target, with_repair_hours

    if not (math.isfinite(args.target_ettr) and 0 < args.target_ettr < 1):
        raise UsageError(f"--target-ettr must be between 0 and 1, not {args.target_ettr}")
    if not 1 <= args.trials <= 100_000:
        raise UsageError(f"--trials must be between 1 and 100000, not {args.trials}")
    if args.repair_hours is not None and not (math.isfinite(args.repair_hours) and 0 <= args.repair_hours <= 1e5):
        raise UsageError(f"--repair-hours must be between 0 and 100000, not {args.repair_hours}")
    cal = _plausible_calibration(calibrate_from_run(args.from_run)) if args.from_run else None
    if cal is not None:
        _apply_calibration(args, cal)
    model, job, policy = job_from_args(args)
    if args.repair_hours is not None:
        model = with_repair_hours(model, args.repair_hours)
    kw = {"trials": args.trials, "seed": args.seed}
    bar = Progress(3, "planning")
    try:
        interval = best_interval(model, job, policy, **kw)
        bar.update()
        tuned = policy.with_(interval=str(interval["best_minutes"]))
        spares = spares_for_target(model, job, tuned, args.target_ettr, **kw)
        bar.update()
        budgets = budgets_for_target(model, job, tuned, args.target_ettr, **kw)
        bar.update()
    finally:
        bar.close()
    doc = {
        "model": model.name,
        "gpus": job.gpus,
        "days": job.days,
        "trials": args.trials,
        "seed": args.seed,
        "calibration": None if cal is None else cal.to_json(),
        "inputs": {
            "step_seconds": job.step_seconds,
            "checkpoint_stall_seconds": policy.checkpoint_stall_seconds,
            "checkpoint_total_seconds": policy.checkpoint_total_seconds or policy.checkpoint_stall_seconds,
            "restart_overhead_seconds": policy.restart_overhead_seconds,
            "relaunch_seconds": policy.relaunch_seconds,
            "restore_seconds": policy.restore_seconds,
        },
        "interval": interval,
        "spares": spares,
        "budgets": budgets,
    }
    if args.json:
        print_json(doc)
    else:
        print(_render(doc))
    return EXIT_OK


def _fmt(x: float | None, unit: str = "", digits: int = 1) -> str:
    return "not reachable" if x is None else f"{x:.{digits}f}{unit}"


def _render(doc: dict[str, Any]) -> str:
    iv, sp, bd = doc["interval"], doc["spares"], doc["budgets"]
    lines = [f"{doc['model']}: {doc['gpus']:,} GPUs, {doc['days']:g} days, {doc['trials']} trials per candidate"]
    if doc["calibration"]:
        c = doc["inputs"]
        lines.append(f"calibrated from {doc['calibration']['run']}: step {c['step_seconds']:.2f} s, "
                     f"stall {c['checkpoint_stall_seconds']:.1f} s, restart {c['restart_overhead_seconds']:.0f} s")
    lines += [
        f"mean time between unexpected failures {iv['mttf_hours']:.2f} h, "
        f"between all interruptions {iv['mtbi_hours']:.2f} h",
        f"checkpoint interval: best simulated {iv['best_minutes']:.1f} min (ETTR {iv['best_ettr']:.4f}); "
        f"Young {iv['young_minutes']:.1f}, Daly {iv['daly_minutes']:.1f}, "
        f"Meta-approximation optimum {iv['meta_optimal_minutes']:.1f} min",
        "   minutes   simulated ETTR   Meta approx",
    ]
    for r in iv["candidates"]:
        lines.append(f"   {r['minutes']:7.1f}   {r['ettr_mean']:.4f}±{r['ettr_stderr']:.4f}   {r['meta_ettr']:.4f}")
    lines.append(f"target ETTR {sp['target_ettr']:.3f}: hot spares needed {_fmt(sp['needed'], '', 0)} "
                 f"(ETTR with unlimited replacements {sp['ettr_unlimited']:.4f})")
    lines.append(f"  max restart overhead {_fmt(bd['max_restart_overhead_seconds'], ' s', 0)} "
                 f"at stall {bd['at_checkpoint_stall_seconds']:g} s; "
                 f"max checkpoint stall {_fmt(bd['max_checkpoint_stall_seconds'], ' s', 1)} "
                 f"at restart {bd['at_restart_overhead_seconds']:g} s")
    return "\n".join(lines)
