"""Overhead of trainguard's automatic instrumentation on an unmodified script, side by side with torchrun.

The same plain DDP script (tests/e2e/unmodified/plain_ddp.py, which never imports trainguard) runs under
bare ``torchrun`` and under ``trainguard run`` (automatic instrumentation: optimizer-step hooks, step
events, heartbeats, flight-recorder polling, control thread; plus the agent's watching), alternating,
``--reps`` times each. The script times its own steps (perf_counter); per run the median step after
warm-up counts, and the overhead is the median of the paired ratios (the machine's load drifts more
between pairs than within one).

Worker start-up: the interpreter's start with the bootstrap on ``PYTHONPATH`` and the agent's
environment vs without, and the same for ``import torch.distributed, torch.optim`` (where the hooks are
installed), best of ``--startup-reps`` each, alternating.

    .venv/bin/python benchmarks/overhead_unmodified.py [--reps 5] [--steps 300] [--width 512]

Prints one JSON object. Goals (issue "any training script"): < 1 % of step time, < 50 ms of start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py"


def one_run(under_trainguard: bool, args: argparse.Namespace, tmp: Path) -> float:
    tag = os.urandom(4).hex()
    timing, ckpt = tmp / f"timing-{tag}.json", tmp / f"ckpt-{tag}"
    script = [str(SCRIPT), "--steps", str(args.steps), "--ckpt-dir", str(ckpt), "--ckpt-every", str(10 * args.steps),
              "--step-seconds", "0", "--width", str(args.width), "--timing-out", str(timing)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["OMP_NUM_THREADS"] = "1"
    if under_trainguard:
        cmd = [sys.executable, "-m", "trainguard", "run", "--standalone", "--nproc-per-node", str(args.ranks),
               "--run-dir", str(tmp / f"run-{tag}"), "--no-health-checks", "--quiet", *script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks),
               *script]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=900)
    steps = json.loads(timing.read_text())["step_seconds"]
    return statistics.median(steps[args.warmup:])


def startup_seconds(code: str, instrumented: bool, reps: int) -> float:
    """Best wall time of ``python -c code`` in a fresh interpreter."""
    from trainguard.core.protocol import WorkerEnv
    from trainguard.worker.bootstrap import site_dir

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    if instrumented:
        with tempfile.TemporaryDirectory() as d:
            env.update(WorkerEnv(run_dir=Path(d), heartbeat_dir=Path(d) / "hb", agent_pid=os.getpid()).to_environ())
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site_dir()), env.get("PYTHONPATH", "")) if p)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--width", type=int, default=512, help="MLP width: sets the step's compute time")
    p.add_argument("--startup-reps", type=int, default=15)
    args = p.parse_args()
    bare: list[float] = []
    guarded: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.reps):
            for flag in ((True, False) if i % 2 == 0 else (False, True)):
                (guarded if flag else bare).append(one_run(flag, args, Path(d)))
    ratios = [g / b for g, b in zip(guarded, bare, strict=True)]
    start: dict[str, dict[str, float]] = {}
    for name, code in (("interpreter", "pass"),
                       ("import_torch_distributed_optim", "import torch.distributed, torch.optim")):
        without = with_ = float("inf")
        for _ in range(3):  # alternate blocks so drift hits both sides alike
            without = min(without, startup_seconds(code, False, args.startup_reps // 3 or 1))
            with_ = min(with_, startup_seconds(code, True, args.startup_reps // 3 or 1))
        start[name] = {"without_seconds": round(without, 4), "with_seconds": round(with_, 4),
                       "added_ms": round((with_ - without) * 1000, 1)}
    overhead = statistics.median(ratios) - 1.0
    added_ms = max(v["added_ms"] for v in start.values())
    print(json.dumps({
        "benchmark": "automatic instrumentation of an unmodified DDP script: trainguard run vs torchrun",
        "ranks": args.ranks, "steps": args.steps, "reps": args.reps, "warmup_steps_skipped": args.warmup,
        "width": args.width,
        "median_step_seconds_torchrun": round(statistics.median(bare), 6),
        "median_step_seconds_trainguard": round(statistics.median(guarded), 6),
        "per_run_median_torchrun": [round(x, 6) for x in bare],
        "per_run_median_trainguard": [round(x, 6) for x in guarded],
        "per_pair_ratio_trainguard_over_torchrun": [round(r, 4) for r in ratios],
        "step_overhead_fraction": round(overhead, 5),
        "startup": start,
        "target_step_fraction": 0.01, "target_startup_ms": 50,
        "meets_step_target": overhead < 0.01, "meets_startup_target": added_ms < 50,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
