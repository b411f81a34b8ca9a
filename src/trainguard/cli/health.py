"""``trainguard health``: node checks before a (re)start; exit 1 when a high-severity check fails."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.errors import EXIT_FAILURE, EXIT_OK, UsageError

if TYPE_CHECKING:
    from trainguard.health import HealthConfig

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
    parser.add_argument("--data-dir", type=Path, action="append", default=[], metavar="D",
                        help="a data directory the job reads (storage round trip and latency); repeatable")
    parser.add_argument("--nic", action="append", default=[], metavar="IFACE",
                        help="an interface that must have link (default: every physical one that is up); repeatable")
    parser.add_argument("--ib-device", action="append", default=[], metavar="DEV",
                        help="an InfiniBand device that must exist (mlx5_0, ...); repeatable")
    parser.add_argument("--record", action="store_true",
                        help="also append the results as events to <run-dir>/events/health-<node>.jsonl")
    nodes = parser.add_argument_group("drained nodes (docs/operations.md)")
    nodes.add_argument("--return-node", metavar="NODE",
                       help="resume NODE in the scheduler after --passes consecutive passing checks: run here "
                            "when this host is NODE, else NODE's rounds recorded in --run-dir (health --record on "
                            "NODE); refused (exit 3) unless trainguard drained it for this user")
    nodes.add_argument("--passes", type=int, default=3, metavar="N",
                       help="with --return-node: consecutive passing check rounds needed (default 3)")
    nodes.add_argument("--pass-interval", type=float, default=60.0, metavar="SECONDS",
                       help="with --return-node: seconds between check rounds (default 60)")
    nodes.add_argument("--drained", action="store_true",
                       help="list the scheduler's drained nodes and whether trainguard drained them")
    nodes.add_argument("--scheduler", default="auto", metavar="NAME",
                       help="auto (default: Slurm with scontrol on the PATH, Kubernetes inside a pod), slurm, "
                            "kubernetes")
    nodes.add_argument("--db", help="fleet database the return is recorded in: a SQLite file or a postgresql:// URL "
                                  "(default: $TRAINGUARD_DB or ~/.local/share/trainguard/fleet.db)")


def _config(args: argparse.Namespace, node: str) -> HealthConfig:
    from trainguard.health import HealthConfig, parse_endpoint

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
    return HealthConfig(
        node=node, run_dir=args.run_dir, checkpoint_dir=args.checkpoint_dir, rdzv_endpoint=args.rdzv_endpoint,
        torch_checks=not args.no_torch, gpu_checks=not args.no_gpu, expected_gpus=args.expected_gpus,
        min_free_bytes=int(args.min_free_gib * 2**30), timeout_seconds=args.timeout,
        data_dirs=tuple(args.data_dir), nics=tuple(args.nic), ib_devices=tuple(args.ib_device))


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.output import print_json
    from trainguard.health import healthy, run_checks

    if args.return_node is not None or args.drained:
        from trainguard.cli.health_nodes import run_nodes

        return run_nodes(args, _config)
    node = args.node or socket.gethostname()
    config = _config(args, node)
    results = run_checks(config)
    if args.record:
        from trainguard.core.rundir import RunDir
        from trainguard.health.node_rounds import writer_name

        with RunDir(args.run_dir).create().writer(writer_name(node)) as w:
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
