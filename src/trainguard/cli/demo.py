"""``trainguard demo``: the reference GPT under ``trainguard run`` on this machine, with injected faults."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import socket
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.errors import UsageError

HELP = "train a small GPT on this machine through injected crashes and hangs, then show the goodput report"

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_gpt.py"
"""The reference workload, shipped inside the package (``trainguard.examples.train_gpt``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from trainguard.cli.run import add_common

    parser.add_argument("--ranks", type=int, default=None, help="ranks on this machine (default 4; with --nodes, "
                                                                 "nodes x ranks per node)")
    parser.add_argument("--nodes", type=int, default=1,
                        help="node agents on this machine, meeting on a loopback rendezvous (default 1); node-level "
                             "faults: node-crash@step=S,node=I, agent-kill@step=S,node=I, unhealthy@node=I,attempt=A")
    parser.add_argument("--ranks-per-node", type=int, default=None, help="ranks per node with --nodes (default 2)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of model and data (default 0)")
    parser.add_argument("--ckpt-every", type=int, default=5, help="checkpoint every N steps (default 5)")
    parser.add_argument("--model", default="d_model=128,layers=2,heads=4,seq=64,batch=8",
                        help="GPT size as key=value list (default d_model=128,layers=2,heads=4,seq=64,batch=8)")
    add_common(parser)


def default_schedule(ranks: int, steps: int) -> str:
    """One crash about a third of the way in, one hang about two thirds in, on different ranks."""
    crash_rank = 1 % ranks
    hang_rank = 2 % ranks if ranks > 2 else 0
    return (f"crash@step={max(2, steps * 3 // 10)},rank={crash_rank};"
            f"hang@step={max(3, steps * 2 // 3)},rank={hang_rank}")


def _model_args(text: str) -> list[str]:
    out: list[str] = []
    allowed = {"d_model", "layers", "heads", "seq", "batch", "vocab"}
    for item in filter(None, (i.strip() for i in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in allowed or not value.isdigit() or not (0 < int(value) <= 4096):
            raise UsageError(f"--model: expected key=value with keys {sorted(allowed)} and values 1..4096, "
                             f"got {item!r}")
        out += [f"--{key.replace('_', '-')}", value]
    return out


def final_loss(run_dir: Path, target: int) -> float | None:
    """Loss of the last execution of the target step on rank 0."""
    from trainguard.core.eventlog import iter_events
    from trainguard.core.events import StepCompleted
    from trainguard.core.protocol import RunLayout

    path = RunLayout(run_dir).rank_events(0)
    loss = None
    if path.exists():
        for _, e in iter_events(path):
            if isinstance(e, StepCompleted) and e.step == target and e.loss is not None:
                loss = e.loss
    return loss


def verdict_line(i: dict[str, Any]) -> str:
    ranks = ",".join(str(r) for r in i.get("culprit_ranks") or i.get("ranks") or []) or "?"
    return (f"  {i['kind']} after step {i.get('step')}: rank {ranks}, detected in "
            f"{i['detection_latency_seconds']:.2f}s, {i.get('time_lost_seconds', 0):.1f}s lost, "
            f"category {i.get('category') or 'Unknown'} -> restarted, recovered")


def _topology(args: argparse.Namespace) -> tuple[int, int]:
    """(nodes, ranks per node); ``args.ranks`` becomes the job's rank count."""
    if not (1 <= args.nodes <= 16):
        raise UsageError("--nodes must be between 1 and 16")
    if args.nodes == 1 and args.ranks_per_node is not None and args.ranks is not None \
            and args.ranks != args.ranks_per_node:
        raise UsageError("--ranks and --ranks-per-node disagree: give one")
    per_node = args.ranks_per_node or (args.ranks if args.nodes == 1 and args.ranks is not None else None)
    per_node = per_node or (4 if args.nodes == 1 else 2)
    if not (1 <= per_node <= 64):
        raise UsageError("--ranks-per-node must be between 1 and 64")
    if args.ranks is not None and args.ranks != args.nodes * per_node:
        raise UsageError(f"--ranks {args.ranks} is not --nodes x --ranks-per-node ({args.nodes} x {per_node})")
    args.ranks = args.nodes * per_node
    return args.nodes, per_node


def _one_node(args: argparse.Namespace, command: list[str]) -> tuple[Any, Any, float]:
    """The job under this process's own supervisor: (config, result, wall seconds)."""
    from trainguard.cli.run import build_config

    cfg = build_config(args, command, nproc=args.ranks, nnodes=(1, 1), endpoint="",
                       node_id=socket.gethostname(), target_steps=args.steps)
    # The console shows rank 0's own progress lines (every 10 steps) and trainguard's lines; the
    # other ranks' output and every stderr stay in the log files.
    cfg = dataclasses.replace(cfg, redirects="2", local_ranks_filter=(0,))
    from trainguard.cli.console import Console
    from trainguard.cli.run import quiet_torch_logs
    from trainguard.launch.supervisor import supervise

    console = Console(cfg, quiet=args.quiet, label="demo")
    console.line(f"{args.ranks} ranks, {args.steps} steps, faults: {cfg.chaos or 'none'}; run dir {cfg.run_dir}")
    quiet_torch_logs(args.verbose)
    console.start()
    t0 = time.time()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the report's (or the JSON's) alone
            result = supervise(cfg)
    finally:
        console.stop()
    wall = time.time() - t0
    console.summary(result)
    return cfg, result, wall


def _many_nodes(args: argparse.Namespace, command: list[str], nodes: int, per_node: int,
                removed: int) -> tuple[Any, Any, float]:
    """One ``trainguard run`` process per node on a loopback c10d rendezvous: (config, job result, wall)."""
    from trainguard.cli import demo_nodes
    from trainguard.cli.run import Rendezvous, build_config
    from trainguard.launch.supervisor import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    low = max(1, nodes - removed)  # the nodes the schedule leaves standing
    cfg = build_config(args, command, nproc=per_node, nnodes=(low, nodes), endpoint=endpoint,
                       node_id=demo_nodes.node_name(0), target_steps=args.steps,
                       rendezvous=Rendezvous("c10d", endpoint, 0, {}))
    if not args.quiet:
        print(f"demo: {nodes} nodes x {per_node} ranks, {args.steps} steps, faults: {cfg.chaos or 'none'}; "
              f"run dir {cfg.run_dir}", file=sys.stderr)
    t0 = time.time()
    outcomes = demo_nodes.run_agents(args, cfg, nodes, low)
    wall = time.time() - t0
    if not args.quiet:
        for o in outcomes:
            print(f"demo: {o.node}: {(o.result or {}).get('status', 'killed')} (exit {o.exit_code})", file=sys.stderr)
    return cfg, demo_nodes.job_result(cfg, outcomes), wall


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.output import print_json

    nodes, per_node = _topology(args)
    if not (1 <= args.steps <= 1_000_000):
        raise UsageError("--steps must be between 1 and 1000000")
    if not (1 <= args.ckpt_every <= 1_000_000):
        raise UsageError("--ckpt-every must be between 1 and 1000000")
    if args.seed < 0:
        raise UsageError("--seed must be >= 0")
    model = _model_args(args.model)
    if getattr(args, "sdc_check_every", None) is None:
        from trainguard.sdc.verdict import DEMO_CHECK_EVERY

        args.sdc_check_every = DEMO_CHECK_EVERY  # a 100-step demo must find an injected flip mid-run
    if args.inject is None:
        args.inject = default_schedule(args.ranks, args.steps)
        if nodes > 1:
            from trainguard.cli.demo_nodes import default_schedule as nodes_schedule

            args.inject = nodes_schedule(nodes, args.steps)
    removed = 0
    if nodes > 1:
        from trainguard.cli.demo_nodes import resolve_nodes

        args.inject, removed = resolve_nodes(args.inject, nodes)
    if not EXAMPLE.is_file():
        from trainguard.errors import InputError

        raise InputError(f"{EXAMPLE}: the reference workload is missing (incomplete install: reinstall trainguard)")
    command = [str(EXAMPLE), "--steps", str(args.steps), "--seed", str(args.seed),
               "--ckpt-every", str(args.ckpt_every), *model]
    if nodes == 1:
        cfg, result, wall = _one_node(args, command)
    else:
        cfg, result, wall = _many_nodes(args, command, nodes, per_node, removed)
    from trainguard.accounting.goodput import compute_goodput
    from trainguard.report.terminal import render_report

    report = compute_goodput(cfg.run_dir)
    gp = report.to_json()
    loss = final_loss(cfg.run_dir, args.steps)
    interruptions = [
        {"kind": i["kind"], "step": i.get("step"),
         "detection_latency_seconds": round(float(i["detection_latency_seconds"]), 3),
         "culprit_ranks": list(i.get("culprit_ranks") or i.get("ranks") or []),
         "category": i.get("category"), "time_lost_seconds": round(float(i.get("time_lost_seconds", 0)), 3)}
        for i in gp["interruptions"]
    ]
    if args.json:
        print_json({
            "run_dir": str(cfg.run_dir), "status": result.status, "exit_code": result.exit_code,
            "reason": result.reason, "ranks": args.ranks, "nodes": nodes, "ranks_per_node": per_node,
            "seed": args.seed, "inject": cfg.chaos or "none",
            "completed_steps": result.completed_steps, "target_steps": args.steps,
            "final_loss": loss if loss is None or math.isfinite(loss) else None,
            "ettr": round(report.ettr, 4), "wall_seconds": round(wall, 2), "attempts": result.attempts,
            "interruptions": interruptions, "unfired_faults": list(result.unfired_faults),
        })
    else:
        print(render_report(report))
        print("interruptions:" if interruptions else "interruptions: none")
        for i in gp["interruptions"]:
            print(verdict_line(i))
        print(f"final loss {loss if loss is not None else 'n/a'} after {result.completed_steps}/{args.steps} steps")
    return int(result.exit_code)
