"""``trainguard simulate``: Monte Carlo of a large job's failures, recoveries, checkpoints and power."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainguard.errors import EXIT_OK, InputError, UsageError

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
    p.add_argument("--checkpoint-interval", default="young", metavar="MINUTES|young|daly|auto|best",
                   help="training time between checkpoints; auto = daly (as in the checkpointer); "
                        "best = best simulated, simulate only (default young)")
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
    r = parser.add_argument_group("recovery schemes (docs/simulation.md)")
    r.add_argument("--inprocess-share", type=float, default=0.0, metavar="P",
                   help="share of failures recovered by in-process restart, 0..1 (default 0: off)")
    r.add_argument("--inprocess-seconds", type=float, default=30.0, metavar="SECONDS",
                   help="detection to first step of an in-process recovery, restore included (default 30)")
    r.add_argument("--warm-start-seconds", type=float, default=None, metavar="SECONDS",
                   help="warm spare processes: relaunch + startup of a full restart (default: cold restarts)")
    r.add_argument("--memory-checkpoint", default="off", choices=("off", "local", "peer"),
                   help="in-memory checkpoints: restore from host RAM when the node survived (local) "
                        "or also from a peer's copy (peer) (default off)")
    r.add_argument("--memory-restore-seconds", type=float, default=5.0, metavar="SECONDS",
                   help="restore from host memory or a peer's copy (default 5)")
    r.add_argument("--replica-groups", type=int, default=1, metavar="G",
                   help="fault-tolerant HSDP replica groups: a failed group drops out, the others train on "
                        "(default 1: off)")
    r.add_argument("--group-reconfigure-seconds", type=float, default=5.0, metavar="SECONDS",
                   help="survivors' pause to form the new quorum when a group drops out (default 5)")


FLAGS = {
    "gpus": "--gpus", "days": "--days", "step_seconds": "--step-seconds", "trials": "--trials", "seed": "--seed",
    "interval": "--checkpoint-interval", "checkpoint_stall_seconds": "--checkpoint-stall",
    "checkpoint_total_seconds": "--checkpoint-total", "restart_overhead_seconds": "--restart-overhead",
    "relaunch_seconds": "--relaunch-seconds", "restore_seconds": "--restore-seconds",
    "crash_detection_seconds": "--crash-detection", "hang_timeout_seconds": "--hang-timeout",
    "sdc_check_seconds": "--sdc-check-hours (in seconds)", "spares": "--spares",
    "straggler_per_day": "--straggler-per-day", "straggler_slowdown": "--straggler-slowdown",
    "straggler_catch_seconds": "--straggler-catch-seconds", "diurnal_swing": "--diurnal-swing",
    "inprocess_share": "--inprocess-share", "inprocess_restart_seconds": "--inprocess-seconds",
    "warm_start_seconds": "--warm-start-seconds", "memory_checkpoint": "--memory-checkpoint",
    "memory_restore_seconds": "--memory-restore-seconds", "replica_groups": "--replica-groups",
    "group_reconfigure_seconds": "--group-reconfigure-seconds", "target_ettr": "--target-ettr",
    "size": "the run's size",
}
"""Configuration field -> the option that sets it, so domain errors read as option errors."""


def require_numpy() -> None:
    """The simulator is the only part of trainguard that needs numpy; say how to get it (exit 2)."""
    try:
        import numpy  # noqa: F401
    except ModuleNotFoundError:
        raise UsageError("the simulator needs numpy, a dependency of trainguard: pip install numpy") from None


@contextmanager
def sim_errors() -> Iterator[None]:
    """Map the simulator's domain errors to the CLI's: bad values exit 2, unreadable inputs exit 3."""
    require_numpy()
    from trainguard.sim.errors import CalibrationError, ModelError, ModelFileError, SimConfigError

    try:
        yield
    except SimConfigError as exc:
        raise UsageError(f"{FLAGS.get(exc.field, exc.field)} {exc.problem}") from None
    except ModelError as exc:
        raise UsageError(str(exc)) from None
    except (ModelFileError, CalibrationError) as exc:
        raise InputError(str(exc)) from None


def job_from_args(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(model, JobConfig, PolicyConfig) from parsed options; raises UsageError on bad values."""
    require_numpy()
    from trainguard.sim.models import load_model
    from trainguard.sim.policy import JobConfig, parse_interval, validate

    for name in ("days", "step_seconds", "checkpoint_stall", "restart_overhead", "sdc_check_hours"):
        if not math.isfinite(getattr(args, name)):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number")
    with sim_errors():
        model = load_model(args.model)
        job = JobConfig(gpus=args.gpus, days=args.days, step_seconds=args.step_seconds)
        policy = _policy_from_args(args, parse_interval)
        validate(job, policy, getattr(args, "trials", 1))
    return model, job, policy


def _policy_from_args(args: argparse.Namespace, parse_interval: Any) -> Any:
    from trainguard.sim.policy import PolicyConfig

    return PolicyConfig(
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
        inprocess_share=args.inprocess_share,
        inprocess_restart_seconds=args.inprocess_seconds,
        warm_start_seconds=args.warm_start_seconds,
        memory_checkpoint=args.memory_checkpoint,
        memory_restore_seconds=args.memory_restore_seconds,
        replica_groups=args.replica_groups,
        group_reconfigure_seconds=args.group_reconfigure_seconds,
    )


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
    require_numpy()
    from trainguard.cli.output import Progress, print_json
    from trainguard.sim.engine import simulate
    from trainguard.sim.events_out import check_size, write_trial
    from trainguard.sim.plan import best_interval_policy
    from trainguard.sim.summary import render_text, to_json

    best = args.checkpoint_interval.strip().lower() == "best"
    if best:
        args.checkpoint_interval = "daly"  # replaced by the search's result below
    model, job, policy = job_from_args(args)
    with sim_errors():
        if args.events:
            _check_events_dir(Path(args.events))
            check_size(model, job)
        if best:
            policy = best_interval_policy(model, job, policy, trials=min(args.trials, 100), seed=args.seed)
        bar = Progress(args.trials, "simulating")
        try:
            result = simulate(model, job, policy, trials=args.trials, seed=args.seed, progress=bar.update)
        finally:
            bar.close()
        doc = to_json(result, seed=args.seed)
        if best:
            doc["policy"]["interval"] = "best"
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
