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
    f = parser.add_argument_group("frontier (stall, restart time and recovery scheme that reach the target)")
    f.add_argument("--frontier-trials", type=int, default=50,
                   help="trials per frontier evaluation (default 50, at most --trials)")
    f.add_argument("--frontier-inprocess-share", type=float, default=0.9, metavar="P",
                   help="share of failures the inprocess scheme recovers in process (default 0.9)")
    f.add_argument("--frontier-replica-groups", type=int, default=8, metavar="G",
                   help="replica groups of the replica-groups scheme (default 8)")
    add_job_arguments(parser)


MAX_CALIBRATED_SECONDS = 7 * 86400.0
"""Longest step, save, restore or restart believed from a run's events; beyond it a figure is corrupt."""
MIN_CALIBRATED_STEP_SECONDS = 1e-3
"""Shortest step time believed from a run's events (no training step of a large job takes under 1 ms)."""


_CALIBRATED_FIGURES = (
    "step_seconds", "checkpoint_stall_seconds", "checkpoint_total_seconds", "restore_seconds", "relaunch_seconds",
    "restart_overhead_seconds", "inprocess_restart_seconds", "memory_stall_seconds", "memory_total_seconds",
    "memory_restore_seconds", "peer_restore_seconds", "memory_restart_seconds", "warm_restart_seconds",
    "warm_start_seconds", "cold_start_seconds")
"""The calibration's durations (each checked by `_plausible_calibration`)."""

INPUTS = {
    "step_seconds": "step_seconds", "checkpoint_stall_seconds": "checkpoint_stall",
    "checkpoint_total_seconds": "checkpoint_total", "restart_overhead_seconds": "restart_overhead",
    "relaunch_seconds": "relaunch_seconds", "restore_seconds": "restore_seconds",
    "inprocess_restart_seconds": "inprocess_seconds", "memory_checkpoint": "memory_checkpoint",
    "memory_restore_seconds": "memory_restore_seconds", "warm_start_seconds": "warm_start_seconds",
}
"""The simulator inputs ``plan --json`` reports (``inputs``, ``sources``), by the option each comes from."""


def _plausible_calibration(cal: Any) -> Any:
    """The calibration with figures no real run produces (negative, not finite, over a week, a step
    under 1 ms) dropped with a warning, so one corrupt record cannot turn into a bad option (exit 2)."""
    from dataclasses import replace

    dropped: dict[str, Any] = {}
    for name in _CALIBRATED_FIGURES:
        value = getattr(cal, name)
        if value is None:
            continue
        low_ok = value >= MIN_CALIBRATED_STEP_SECONDS if name == "step_seconds" else value >= 0
        if not (math.isfinite(value) and low_ok and value <= MAX_CALIBRATED_SECONDS):
            log.warning("calibration from %s: %s = %g is implausible; the option's value is used instead",
                        cal.run, name, value)
            dropped[name] = None
    return replace(cal, **dropped) if dropped else cal


def _apply_calibration(args: argparse.Namespace, cal: Any) -> dict[str, str]:
    """Measured figures replace the corresponding options; returns ``measured`` or ``derived`` (computed
    from measured figures and options) by `INPUTS` name, for the inputs the run set."""
    measured: dict[str, str] = {}

    def take(name: str, value: Any, how: str = "measured") -> None:
        setattr(args, INPUTS[name], value)
        measured[name] = how

    if cal.step_seconds:
        take("step_seconds", cal.step_seconds)
    if cal.checkpoint_stall_seconds is not None:
        take("checkpoint_stall_seconds", cal.checkpoint_stall_seconds)
    if cal.checkpoint_total_seconds is not None:
        take("checkpoint_total_seconds", max(cal.checkpoint_total_seconds, args.checkpoint_stall))
    if cal.restore_seconds is not None:
        take("restore_seconds", cal.restore_seconds)
    if cal.relaunch_seconds is not None:
        take("relaunch_seconds", cal.relaunch_seconds)
    if cal.restart_overhead_seconds is not None:
        take("restart_overhead_seconds", cal.restart_overhead_seconds)
    elif cal.cold_start_seconds is not None:  # every restart restored from memory: add storage's restore
        take("restart_overhead_seconds", cal.cold_start_seconds + args.restore_seconds, "derived")
    if cal.inprocess_restart_seconds is not None:
        take("inprocess_restart_seconds", cal.inprocess_restart_seconds)
    if cal.warm_start_seconds is not None and args.warm_start_seconds is None:
        take("warm_start_seconds", cal.warm_start_seconds)
    _apply_memory_tier(args, cal, take)
    floor = args.relaunch_seconds + args.restore_seconds
    if args.restart_overhead < floor:
        take("restart_overhead_seconds", floor, "derived")
    return measured


def _apply_memory_tier(args: argparse.Namespace, cal: Any, take: Any) -> None:
    """A run that used the memory tier is planned with it: its copies' stall and background time are the
    checkpoint's, its restores replace ``--memory-restore-seconds`` (docs/simulation.md, "--from-run")."""
    if cal.memory_stall_seconds is None:
        return
    if args.memory_checkpoint == "off":
        take("memory_checkpoint", "peer" if cal.memory_replicated or cal.peer_restore_seconds is not None
             else "local")
    take("checkpoint_stall_seconds", cal.memory_stall_seconds)
    take("checkpoint_total_seconds", max(cal.memory_total_seconds or 0.0, cal.memory_stall_seconds))
    # one figure stands for both: a peer's replica when peer copies cover the failure, else this node's
    restores = [cal.memory_restore_seconds] + ([cal.peer_restore_seconds] if args.memory_checkpoint == "peer" else [])
    known = [r for r in restores if r is not None]
    if known:
        take("memory_restore_seconds", max(known))


def _sources(args: argparse.Namespace, measured: dict[str, str]) -> dict[str, str]:
    """Per input: ``measured``, ``derived`` (from measured figures), ``default`` or ``option`` (given)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    return {name: measured.get(name) or ("default" if getattr(args, dest) == parser.get_default(dest) else "option")
            for name, dest in INPUTS.items()}


def _frontier_config(args: argparse.Namespace) -> Any:
    from trainguard.sim.frontier import FrontierConfig

    if not (math.isfinite(args.frontier_inprocess_share) and 0 < args.frontier_inprocess_share <= 1):
        raise UsageError(f"--frontier-inprocess-share must be above 0 and at most 1, "
                         f"not {args.frontier_inprocess_share}")
    if not 2 <= args.frontier_replica_groups <= 1_000_000:
        raise UsageError(f"--frontier-replica-groups must be between 2 and 1000000, "
                         f"not {args.frontier_replica_groups}")
    return FrontierConfig(target_ettr=args.target_ettr, inprocess_share=args.frontier_inprocess_share,
                          replica_groups=args.frontier_replica_groups)


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.simulate import job_from_args, require_numpy, sim_errors

    require_numpy()
    from trainguard.cli.output import Progress, print_json
    from trainguard.sim.calibrate import calibrate_from_run
    from trainguard.sim.frontier import find_frontier, frontier_json
    from trainguard.sim.plan import best_interval, budgets_for_target, spares_for_target, with_repair_hours

    if not (math.isfinite(args.target_ettr) and 0 < args.target_ettr < 1):
        raise UsageError(f"--target-ettr must be between 0 and 1, not {args.target_ettr}")
    if not 1 <= args.trials <= 100_000:
        raise UsageError(f"--trials must be between 1 and 100000, not {args.trials}")
    if args.repair_hours is not None and not (math.isfinite(args.repair_hours) and 0 <= args.repair_hours <= 1e5):
        raise UsageError(f"--repair-hours must be between 0 and 100000, not {args.repair_hours}")
    if not 1 <= args.frontier_trials <= 100_000:
        raise UsageError(f"--frontier-trials must be between 1 and 100000, not {args.frontier_trials}")
    with sim_errors():
        frontier_config = _frontier_config(args)
        cal = _plausible_calibration(calibrate_from_run(args.from_run)) if args.from_run else None
    measured = _apply_calibration(args, cal) if cal is not None else {}
    model, job, policy = job_from_args(args)
    if args.repair_hours is not None:
        model = with_repair_hours(model, args.repair_hours)
    kw = {"trials": args.trials, "seed": args.seed}
    bar = Progress(4, "planning")
    try:
        with sim_errors():
            interval = best_interval(model, job, policy, **kw)
            bar.update()
            tuned = policy.with_(interval=str(interval["best_minutes"]))
            spares = spares_for_target(model, job, tuned, args.target_ettr, **kw)
            bar.update()
            budgets = budgets_for_target(model, job, tuned, args.target_ettr, **kw)
            bar.update()
            frontier = find_frontier(model, job, policy, frontier_config,
                                     trials=min(args.frontier_trials, args.trials), seed=args.seed)
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
            "inprocess_restart_seconds": policy.inprocess_restart_seconds,
            "step_seconds": job.step_seconds,
            "checkpoint_stall_seconds": policy.checkpoint_stall_seconds,
            "checkpoint_total_seconds": policy.checkpoint_total_seconds or policy.checkpoint_stall_seconds,
            "restart_overhead_seconds": policy.restart_overhead_seconds,
            "relaunch_seconds": policy.relaunch_seconds,
            "restore_seconds": policy.restore_seconds,
            "memory_checkpoint": policy.memory_checkpoint,
            "memory_restore_seconds": policy.memory_restore_seconds,
            "warm_start_seconds": policy.warm_start_seconds,
        },
        "sources": _sources(args, measured),
        "interval": interval,
        "spares": spares,
        "budgets": budgets,
        "frontier": {"trials": min(args.frontier_trials, args.trials), **frontier_json(frontier)},
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
                     f"stall {c['checkpoint_stall_seconds']:.3g} s, restart {c['restart_overhead_seconds']:.0f} s")
        measured = doc["calibration"]
        if measured.get("memory_stall_seconds") is not None:
            lines.append(f"  memory tier measured there: copy stall {measured['memory_stall_seconds']:.3f} s, "
                         f"restore {c['memory_restore_seconds']:.2f} s (planned as --memory-checkpoint "
                         f"{c['memory_checkpoint']})")
        if measured.get("inprocess_restart_seconds") is not None:
            share = measured.get("inprocess_share")
            lines.append(f"  in-process restarts measured there: {measured['inprocess_restart_seconds']:.2f} s"
                         + ("" if share is None else f", {share:.0%} without falling back"))
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
    lines += _render_frontier(doc["frontier"])
    return "\n".join(lines)


_SCHEME_WORDS = {"restart": "full restart", "inprocess": "in-process restart", "replica-groups": "replica groups"}


def _render_frontier(fr: dict[str, Any]) -> list[str]:
    lines = [f"frontier for ETTR {fr['target_ettr']:.3f} (each row: a save stalling at most this long and a "
             "restart at most this long reach it):"]
    for scheme, best in fr["best_ettr"].items():
        pts = [p for p in fr["points"] if p["scheme"] == scheme]
        name = _SCHEME_WORDS.get(scheme, scheme)
        if scheme == "inprocess":
            name += f" ({fr['inprocess_share']:.0%} of failures; the rest full restarts)"
        elif scheme == "replica-groups":
            name += f" ({fr['replica_groups']} groups)"
        if not pts:
            bad = fr["corner_badput_fraction"][scheme]
            top = sorted(bad.items(), key=lambda kv: -kv[1])[:2]
            lines.append(f"  {name}: not reachable; even 0.5 s restarts and a {fr['stalls_seconds'][0]:g} s "
                         f"stall give ETTR {best:.4f} (largest losses: "
                         + ", ".join(f"{b} {v:.1%}" for b, v in top) + ")")
            f = fr["detection_scale"].get(scheme)
            lines.append("     not even with instant detection" if f is None else
                         f"     reachable there if every detection latency is at most {f:.2f}x the options' "
                         f"(crash, hang timeout, SDC check interval)")
            continue
        lines.append(f"  {name}:")
        lines += [f"     stall <= {p['checkpoint_stall_seconds']:6g} s   restart <= {p['restart_seconds']:8.1f} s   "
                  f"(ETTR {p['ettr']:.4f}, interval {p['interval_minutes']:.1f} min)" for p in pts]
    if not fr["reachable"]:
        lines.append("  target not reachable by any scheme at this scale: shorten detection (--hang-timeout, "
                     "--crash-detection, --sdc-check-hours) or lower --target-ettr")
    return lines
