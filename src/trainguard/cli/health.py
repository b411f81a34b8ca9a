"""``trainguard health``: node checks before a (re)start; exit 1 when a high-severity check fails."""

from __future__ import annotations

import argparse
import re
import socket
from pathlib import Path

from trainguard.errors import EXIT_FAILURE, EXIT_OK, UsageError

HELP = "check this node (disks, memory, clock, rendezvous, torch, GPUs); exit 1 on a high-severity failure"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON list of check results")
    parser.add_argument("--node", default=None, help="node name (default: this host's name)")
    parser.add_argument("--run-dir", type=Path, help="run directory to check (and where chaos flags live)")
    parser.add_argument("--checkpoint-dir", type=Path, help="checkpoint directory to check")
    parser.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="rendezvous endpoint to connect to")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch device and gloo checks")
    parser.add_argument("--no-gpu", action="store_true", help="skip the NVML GPU checks")
    parser.add_argument("--expected-gpus", type=int, metavar="N", help="GPUs this node must have")
    parser.add_argument("--min-free-gib", type=float, default=1.0, metavar="G",
                        help="free space the run and checkpoint directories need (default 1)")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="limit for each blocking probe (default 5)")
    parser.add_argument("--record", action="store_true",
                        help="also append the results as events to <run-dir>/events/health-<node>.jsonl")


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.output import print_json
    from trainguard.health import HealthConfig, healthy, parse_endpoint, run_checks

    node = args.node or socket.gethostname()
    if not node.strip():
        raise UsageError("--node must not be empty")
    if args.rdzv_endpoint is not None:
        try:
            parse_endpoint(args.rdzv_endpoint)
        except ValueError as exc:
            raise UsageError(f"--rdzv-endpoint: {exc}") from None
    if args.expected_gpus is not None and args.expected_gpus < 0:
        raise UsageError("--expected-gpus must be >= 0")
    if not 0 <= args.min_free_gib < 1e6:
        raise UsageError("--min-free-gib must be between 0 and 1e6")
    if not 0 < args.timeout <= 600:
        raise UsageError("--timeout must be in (0, 600] seconds")
    if args.record and args.run_dir is None:
        raise UsageError("--record needs --run-dir")
    config = HealthConfig(
        node=node, run_dir=args.run_dir, checkpoint_dir=args.checkpoint_dir, rdzv_endpoint=args.rdzv_endpoint,
        torch_checks=not args.no_torch, gpu_checks=not args.no_gpu, expected_gpus=args.expected_gpus,
        min_free_bytes=int(args.min_free_gib * 2**30), timeout_seconds=args.timeout)
    results = run_checks(config)
    if args.record:
        from trainguard.rundir import RunDir

        writer_name = "health-" + re.sub(r"[^A-Za-z0-9_.@-]", "_", node)
        with RunDir(args.run_dir).create().writer(writer_name) as w:
            for r in results:
                w.write(r.to_event(node))
    if args.json:
        print_json([r.to_json() for r in results])
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            status = "SKIP" if r.skipped else ("ok" if r.ok else "FAIL")
            print(f"{status:4}  {r.name:<{width}}  [{r.severity}]  {r.detail}")
        verdict = "healthy" if healthy(results) else "UNHEALTHY (a high-severity check failed)"
        print(f"node {node}: {verdict}")
    return EXIT_OK if healthy(results) else EXIT_FAILURE
