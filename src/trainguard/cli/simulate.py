"""``trainguard simulate``: Monte Carlo of a large job's failures, recoveries, checkpoints and power."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from trainguard.errors import EXIT_OK, UsageError

HELP = "simulate a large training job's failures and recovery (ETTR, interruptions, power)"


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``simulate`` and ``plan``: model, job size, policy."""
    g = parser.add_argument_group("model and job")
    g.add_argument("--model", default="llama3", help="built-in failure model (llama3, rsc1, rsc2) or a .toml file")
    g.add_argument("--gpus", type=int, default=16384, help="GPUs in the job (default 16384)")
    g.add_argument("--days", type=float, default=54.0, help="simulated wall-clock days (default 54)")
    g.add_argument("--step-seconds", type=float, default=10.0, help="time of one training step (default 10)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p = parser.add_argument_group("policy")
    p.add_argument("--checkpoint-interval", default="young", metavar="MINUTES|young|daly|auto",
                   help="training time between checkpoints; auto = best simulated (default young)")
    p.add_argument("--checkpoint-stall", type=float, default=60.0, metavar="SECONDS",
                   help="time training stops for each save (default 60)")
    p.add_argument("--checkpoint-total", type=float, default=None, metavar="SECONDS",
                   help="save start to durable, async part included (default: the stall)")
    p.add_argument("--restart-overhead", type=float, default=600.0, metavar="SECONDS",
                   help="failure detection to the first new step: relaunch + startup + restore (default 600)")
    p.add_argument("--relaunch-seconds", type=float, default=60.0, help="part of the overhead before workers start")
    p.add_argument("--restore-seconds", type=float, default=120.0, help="part of the overhead loading the checkpoint")
    p.add_argument("--crash-detection", type=float, default=30.0, metavar="SECONDS", help="crash detection latency")
    p.add_argument("--hang-timeout", type=float, default=600.0, metavar="SECONDS", help="hang detection timeout")
    p.add_argument("--sdc-check-hours", type=float, default=1.0, help="interval of silent-corruption checks")
    p.add_argument("--spares", type=int, default=None, help="hot spare nodes (default: replacements always ready)")
    p.add_argument("--straggler-per-day", type=float, default=0.0, help="straggler episodes a day (default 0)")
    p.add_argument("--straggler-slowdown", type=float, default=1.1, help="step-time factor of a straggler")
    p.add_argument("--straggler-catch-seconds", type=float, default=1800.0, help="time to catch a straggler")
    p.add_argument("--diurnal-swing", type=float, default=0.015, help="daily throughput swing (default 0.015)")


def job_from_args(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(model, JobConfig, PolicyConfig) from parsed options; raises UsageError on bad values."""
    from trainguard.sim.models import load_model
    from trainguard.sim.policy import JobConfig, PolicyConfig, parse_interval, validate

    model = load_model(args.model)
    for name in ("days", "step_seconds", "checkpoint_stall", "restart_overhead", "sdc_check_hours"):
        if not math.isfinite(getattr(args, name)):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number")
    job = JobConfig(gpus=args.gpus, days=args.days, step_seconds=args.step_seconds)
    policy = PolicyConfig(
        interval=parse_interval(args.checkpoint_interval),
        checkpoint_stall_seconds=args.checkpoint_stall,
        checkpoint_total_seconds=args.checkpoint_total,
        restart_overhead_seconds=args.restart_overhead,
        relaunch_seconds=args.relaunch_seconds,
        restore_seconds=args.restore_seconds,
        crash_detection_seconds=args.crash_detection,
        hang_timeout_seconds=args.hang_timeout,
        sdc_check_seconds=args.sdc_check_hours * 3600.0,
        spares=args.spares,
        straggler_per_day=args.straggler_per_day,
        straggler_slowdown=args.straggler_slowdown,
        straggler_catch_seconds=args.straggler_catch_seconds,
        diurnal_swing=args.diurnal_swing,
    )
    validate(job, policy, getattr(args, "trials", 1))
    return model, job, policy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=1000, help="Monte Carlo trials (default 1000)")
    parser.add_argument("--events", metavar="DIR", help="also write one trial as a run directory for `report`")
    parser.add_argument("--json", action="store_true", help="print one JSON document (docs/simulation.md)")
    add_job_arguments(parser)


def _check_events_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise UsageError(f"--events {path}: exists and is not a directory")
    if (path / "events").is_dir() and any((path / "events").glob("*.jsonl")):
        raise UsageError(f"--events {path}: already holds a run's events; choose a new directory")


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.output import Progress, print_json
    from trainguard.sim.engine import simulate
    from trainguard.sim.events_out import check_size, write_trial
    from trainguard.sim.plan import resolve_auto
    from trainguard.sim.summary import render_text, to_json

    model, job, policy = job_from_args(args)
    if args.events:
        _check_events_dir(Path(args.events))
        check_size(model, job)
    policy = resolve_auto(model, job, policy, trials=min(args.trials, 100), seed=args.seed)
    bar = Progress(args.trials, "simulating")
    try:
        result = simulate(model, job, policy, trials=args.trials, seed=args.seed, progress=bar.update)
    finally:
        bar.close()
    doc = to_json(result, seed=args.seed)
    if args.checkpoint_interval.strip().lower() == "auto":
        doc["policy"]["interval"] = "auto"
    if args.events:
        written = write_trial(args.events, model, job, policy, seed=args.seed)
        doc["events_trial"] = written.to_json()
    if args.json:
        print_json(doc)
    else:
        print(render_text(doc))
        if args.events:
            print(f"one trial written to {args.events} (ETTR {doc['events_trial']['ettr']:.4f}); "
                  f"see it with: trainguard report {args.events}")
    return EXIT_OK
