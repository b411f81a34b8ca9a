"""Step-time overhead of the in-rank library on a fault-free run, side by side with the bare workload.

Runs trainguard/examples/train_gpt.py under plain torchrun, alternating "with trainguard" (attach() with the
agent's environment: heartbeats, control thread, step events) and "without" (``--no-trainguard``),
``--reps`` times each. The script times every step itself (perf_counter around the step, so the
library's own per-step work is inside the measurement), in wall time and in the rank process's CPU
time (all its threads: the control thread's share counts), which the machine's load disturbs less.
Per run: median step time after warm-up
(which also covers the control thread's one-time flight-recorder pre-warm). Each "with" run is paired
with the "without" run next to it; the overhead is the median of the pairs' ratios, because on a
shared machine the load drifts more between pairs than within one.

It also times the library's own per-step work in one process (step + four phases + step event +
heartbeats, no collective), which does not depend on the machine's load, and relates it to the
bare median step time.

    .venv/bin/python benchmarks/overhead.py [--reps 5] [--ranks 2] [--steps 120]

Prints one JSON object.
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
GPT = ROOT / "src" / "trainguard" / "examples" / "train_gpt.py"
MODEL = ["--d-model", "128", "--layers", "2", "--heads", "4", "--seq", "64", "--batch", "8"]


def one_run(ranks: int, steps: int, with_library: bool, tmp: Path, warmup: int) -> tuple[float, float]:
    timing = tmp / f"timing-{with_library}-{os.urandom(4).hex()}.json"
    run_dir = tmp / f"run-{os.urandom(4).hex()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if with_library:  # what `trainguard run` hands its workers
        env.update(TRAINGUARD_AGENT="1", TRAINGUARD_RUN_DIR=str(run_dir),
                   TRAINGUARD_HEARTBEAT_DIR=str(run_dir / "heartbeats"), TRAINGUARD_ATTEMPT="0")
    else:
        env["TRAINGUARD_RUN_DIR"] = str(run_dir)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(GPT), "--steps", str(steps),
           "--ckpt-every", str(10 * steps), "--timing-out", str(timing), *MODEL]
    if not with_library:
        cmd.append("--no-trainguard")
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=600)
    data = json.loads(timing.read_text())
    return statistics.median(data["step_seconds"][warmup:]), statistics.median(data["step_cpu_seconds"][warmup:])


def library_cost_seconds(n: int = 3000) -> float:
    """Median wall time of the library's per-step bookkeeping, measured in this process."""
    with tempfile.TemporaryDirectory() as d:
        os.environ.update(TRAINGUARD_HEARTBEAT_DIR=str(Path(d) / "hb"), TRAINGUARD_AGENT="1")
        from trainguard.worker import attach

        w = attach(Path(d) / "run", rank=0)
        samples = []
        for step in range(1, n + 1):
            t0 = time.perf_counter()
            with w.step(step) as s:
                for phase in ("data", "forward_backward", "comm_wait", "optimizer"):
                    with s.phase(phase):
                        pass
                s.loss = 1.0
            samples.append(time.perf_counter() - t0)
        w.close()
    return statistics.median(samples)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--warmup", type=int, default=40)
    args = p.parse_args()
    with_lib: list[float] = []
    without: list[float] = []
    cpu_with: list[float] = []
    cpu_without: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.reps):
            order = (True, False) if i % 2 == 0 else (False, True)  # alternate to cancel drift
            for flag in order:
                wall, cpu = one_run(args.ranks, args.steps, flag, Path(d), args.warmup)
                (with_lib if flag else without).append(wall)
                (cpu_with if flag else cpu_without).append(cpu)
    base, lib = statistics.median(without), statistics.median(with_lib)
    ratios = [w / b for w, b in zip(with_lib, without, strict=True)]
    overhead = statistics.median(ratios) - 1.0
    cost = library_cost_seconds()
    cpu_ratios = [w / b for w, b in zip(cpu_with, cpu_without, strict=True)]
    print(json.dumps({
        "benchmark": "in-rank library step-time overhead (fault-free)",
        "ranks": args.ranks, "steps": args.steps, "reps": args.reps, "warmup_steps_skipped": args.warmup,
        "median_step_seconds_without": round(base, 6),
        "median_step_seconds_with": round(lib, 6),
        "per_run_median_without": [round(x, 6) for x in without],
        "per_run_median_with": [round(x, 6) for x in with_lib],
        "per_pair_ratio_with_over_without": [round(r, 4) for r in ratios],
        "overhead_fraction": round(overhead, 5),
        "median_step_cpu_seconds_without": round(statistics.median(cpu_without), 6),
        "median_step_cpu_seconds_with": round(statistics.median(cpu_with), 6),
        "per_pair_cpu_ratio_with_over_without": [round(r, 4) for r in cpu_ratios],
        "cpu_overhead_fraction": round(statistics.median(cpu_ratios) - 1.0, 5),
        "library_seconds_per_step_in_process": round(cost, 7),
        "library_fraction_of_bare_step": round(cost / base, 5),
        "target_fraction": 0.01,
        "meets_target": overhead < 0.01,
        "library_cost_meets_target": cost / base < 0.01,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
