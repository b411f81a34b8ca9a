"""``trainguard run``: supervise a training job on this node (crash and hang detection, evidence, restarts)."""

from __future__ import annotations

import argparse
import socket
import time
from pathlib import Path
from typing import Any

from trainguard.errors import StorageError, UsageError

HELP = "supervise a training job: launch, watch, gather evidence, restart from the last checkpoint"


def add_common(parser: argparse.ArgumentParser) -> None:
    """Options shared with ``trainguard demo``."""
    parser.add_argument("--run-dir", help="run directory (default: runs/<run id>)")
    parser.add_argument("--inject", default=None, metavar="SPEC",
                        help="chaos schedule, e.g. 'crash@step=30,rank=1;hang@step=60,rank=2' (docs/run.md)")
    parser.add_argument("--max-restarts", type=int, default=3, help="restart budget (default 3)")
    parser.add_argument("--hang-floor", type=float, default=4.0, metavar="SECONDS",
                        help="never call a hang sooner than this after the last step (default 4)")
    parser.add_argument("--hang-multiplier", type=float, default=3.0,
                        help="hang timeout = this x median step time, if above the floor (default 3)")
    parser.add_argument("--first-step-allowance", type=float, default=120.0, metavar="SECONDS",
                        help="time allowed from a (re)start to the first step (default 120)")
    parser.add_argument("--checkpoint-allowance", type=float, default=120.0, metavar="SECONDS",
                        help="time allowed inside a checkpoint phase (default 120)")
    parser.add_argument("--no-progress-attempts", type=int, default=3,
                        help="stop after this many failed attempts without a new checkpoint (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON result on stdout")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nnodes", default="1", help="nodes, N or MIN:MAX (default 1)")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="ranks on this node (default 1)")
    parser.add_argument("--rdzv-endpoint", default="", help="host:port of the c10d rendezvous (default: "
                        "a free port on 127.0.0.1, single node only)")
    parser.add_argument("--rdzv-id", default=None, help="job id shared by all nodes (default: run dir name)")
    parser.add_argument("--node-id", default=None, help="this node's name (default: host name)")
    parser.add_argument("--rdzv-last-call", type=int, default=2, metavar="SECONDS",
                        help="with MIN:MAX nodes, how long to wait for more nodes once MIN joined (default 2)")
    parser.add_argument("--no-health-checks", action="store_true", help="skip node health checks")
    add_common(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py [args]")


def parse_nnodes(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise UsageError(f"--nnodes must be N or MIN:MAX, got {text!r}") from None
    if a < 1 or b < a or b > 4096:
        raise UsageError(f"--nnodes must satisfy 1 <= MIN <= MAX <= 4096, got {text!r}")
    return a, b


def build_config(args: argparse.Namespace, command: list[str], *, nproc: int, nnodes: tuple[int, int],
                 endpoint: str, node_id: str | None, target_steps: int | None = None,
                 health_checks: bool = True) -> Any:
    from trainguard import chaos
    from trainguard.launch import SupervisorConfig, WatchdogConfig

    faults = chaos.parse_spec(args.inject)
    for name in ("max_restarts", "no_progress_attempts"):
        if getattr(args, name) < 0 or getattr(args, name) > 10_000:
            raise UsageError(f"--{name.replace('_', '-')} must be between 0 and 10000")
    for name in ("hang_floor", "hang_multiplier", "first_step_allowance", "checkpoint_allowance"):
        value = getattr(args, name)
        if not (0 < value < 1e6):
            raise UsageError(f"--{name.replace('_', '-')} must be a positive number of seconds")
    if not (1 <= getattr(args, "rdzv_last_call", 2) <= 3600):
        raise UsageError("--rdzv-last-call must be between 1 and 3600 seconds")
    if not (1 <= nproc <= 1024):
        raise UsageError("--nproc-per-node must be between 1 and 1024")
    if not endpoint and nnodes[1] > 1:
        raise UsageError("--rdzv-endpoint is required with more than one node")
    run_dir = Path(args.run_dir) if args.run_dir else Path("runs") / time.strftime("run-%Y%m%d-%H%M%S")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"cannot create run directory {run_dir}: {exc.strerror}") from None
    if not endpoint:
        from trainguard.launch.supervisor import free_port

        endpoint = f"127.0.0.1:{free_port()}"
    return SupervisorConfig(
        command=tuple(command), run_dir=run_dir.resolve(),
        run_id=getattr(args, "rdzv_id", None) or run_dir.resolve().name,
        node_id=node_id or socket.gethostname(), nproc_per_node=nproc,
        min_nodes=nnodes[0], max_nodes=nnodes[1], rdzv_endpoint=endpoint,
        max_restarts=args.max_restarts, max_no_progress_attempts=max(1, args.no_progress_attempts),
        watchdog=WatchdogConfig(floor_seconds=args.hang_floor, multiplier=args.hang_multiplier,
                                first_step_allowance_seconds=args.first_step_allowance,
                                checkpoint_allowance_seconds=args.checkpoint_allowance),
        chaos=chaos.format_spec(faults) if faults else "", health_checks=health_checks,
        target_steps=target_steps, last_call_seconds=int(getattr(args, "rdzv_last_call", 2)),
    )


def result_json(cfg: Any, result: Any) -> dict[str, Any]:
    return {
        "run_dir": str(cfg.run_dir),
        "node": cfg.node_id,
        "status": result.status,
        "exit_code": result.exit_code,
        "reason": result.reason,
        "attempts": result.attempts,
        "completed_steps": result.completed_steps,
        "failures": [
            {"attempt": f.attempt, "kind": f.kind, "step": f.step, "ranks": list(f.ranks),
             "detection_latency_seconds": round(f.detection_latency_seconds, 3), "detail": f.detail}
            for f in result.failures
        ],
    }


def run(args: argparse.Namespace) -> int:
    import sys

    from trainguard.cli.output import print_json

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no training command: use trainguard run [options] -- script.py [args]")
    if command[0].endswith(".py") and not Path(command[0]).is_file():
        from trainguard.errors import InputError

        raise InputError(f"{command[0]}: no such training script")
    cfg = build_config(args, command, nproc=args.nproc_per_node, nnodes=parse_nnodes(args.nnodes),
                       endpoint=args.rdzv_endpoint, node_id=args.node_id,
                       health_checks=not args.no_health_checks)
    from trainguard.launch.supervisor import supervise

    print(f"trainguard run: run dir {cfg.run_dir}, node {cfg.node_id}, {cfg.nproc_per_node} rank(s)",
          file=sys.stderr)
    result = supervise(cfg)
    print(f"trainguard run: {result.status}: {result.reason}", file=sys.stderr)
    if args.json:
        print_json(result_json(cfg, result))
    return int(result.exit_code)
