"""Restart latency of `trainguard run` against a bare `torchrun --max-restarts` restart, same workload, same run.

Both runs train examples/train_gpt.py (2 ranks by default) and SIGKILL rank 1 at the same step with
the same chaos injection (the in-rank library fires it in both: under torchrun it runs without an
agent). Measured from the events the ranks write:

* fault -> first new step: the injected fault's time to the first step completed by every rank in
  the next attempt (the same yardstick for both);
* for trainguard also detection -> first new step (FailureDetected.time to the same point), and the
  detection latency itself.

Bare torchrun needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 to restart gloo workers at all (see
shared/reference/pytorch-2.13-cpu-facts.md); it gathers no evidence and runs no health checks.

    .venv/bin/python benchmarks/restart.py [--reps 2] [--ranks 2] [--steps 30] [--crash-step 12]

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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "examples" / "train_gpt.py"
MODEL = ["--d-model", "128", "--layers", "2", "--heads", "4", "--seq", "64", "--batch", "8"]


def _events(run_dir: Path, prefix: str) -> list[dict[str, Any]]:
    out = []
    for p in sorted((run_dir / "events").glob(f"{prefix}*.jsonl")):
        out += [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return out


def _first_new_step(run_dir: Path, attempt: int, ranks: int) -> float:
    firsts: dict[int, float] = {}
    for e in _events(run_dir, "rank-"):
        if e["type"] == "step_completed" and e["attempt"] == attempt:
            firsts[e["rank"]] = min(firsts.get(e["rank"], e["time"]), e["time"])
    if len(firsts) < ranks:
        raise RuntimeError(f"{run_dir}: attempt {attempt} completed no step on every rank")
    return max(firsts.values())


def _fault_time(run_dir: Path) -> float:
    return min(e["time"] for e in _events(run_dir, "rank-") if e["type"] == "fault_injected")


def _common(args: argparse.Namespace, run_dir: Path) -> list[str]:
    return [str(GPT), "--steps", str(args.steps), "--ckpt-every", str(args.ckpt_every), "--seed", "1",
            "--ckpt-dir", str(run_dir / "checkpoints"), *MODEL]


def trainguard_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    spec = f"crash@step={args.crash_step},rank=1"
    subprocess.run([sys.executable, "-m", "trainguard", "run", "--nproc-per-node", str(args.ranks),
                    "--run-dir", str(run_dir), "--max-restarts", "1", "--inject", spec,
                    "--", *_common(args, run_dir)], check=True, capture_output=True, timeout=600)
    failure = next(e for e in _events(run_dir, "agent-") if e["type"] == "failure_detected")
    first = _first_new_step(run_dir, 1, args.ranks)
    return {"fault_to_first_new_step_seconds": first - _fault_time(run_dir),
            "detection_to_first_new_step_seconds": first - failure["time"],
            "detection_latency_seconds": failure["detection_latency_seconds"]}


def torchrun_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1", TRAINGUARD_RUN_DIR=str(run_dir),
               TRAINGUARD_CHAOS=f"crash@step={args.crash_step},rank=1")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
                    "--max-restarts", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
                    *_common(args, run_dir)], env=env, check=True, capture_output=True, timeout=600)
    first = _first_new_step(run_dir, 1, args.ranks)
    return {"fault_to_first_new_step_seconds": first - _fault_time(run_dir)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--crash-step", type=int, default=12)
    p.add_argument("--ckpt-every", type=int, default=5)
    args = p.parse_args()
    tg: list[dict[str, float]] = []
    bare: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.reps):
            order = ("tg", "bare") if i % 2 == 0 else ("bare", "tg")
            for which in order:
                run_dir = Path(d) / f"{which}-{i}"
                (tg if which == "tg" else bare).append(
                    trainguard_run(args, run_dir) if which == "tg" else torchrun_run(args, run_dir))

    def med(rows: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 3)

    tg_fault = med(tg, "fault_to_first_new_step_seconds")
    bare_fault = med(bare, "fault_to_first_new_step_seconds")
    print(json.dumps({
        "benchmark": "restart latency after a rank crash (SIGKILL)",
        "ranks": args.ranks, "reps": args.reps, "crash_step": args.crash_step,
        "trainguard": {
            "fault_to_first_new_step_seconds": tg_fault,
            "detection_to_first_new_step_seconds": med(tg, "detection_to_first_new_step_seconds"),
            "detection_latency_seconds": med(tg, "detection_latency_seconds"),
            "runs": tg,
        },
        "torchrun_max_restarts": {"fault_to_first_new_step_seconds": bare_fault, "runs": bare},
        "ratio_trainguard_over_torchrun": round(tg_fault / bare_fault, 3),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
