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

Time to first step: the Lightning Fabric and Hugging Face ``Trainer`` scripts of the tests
(tests/e2e/userscripts/fabric_loop.py, hf_clm.py; each writes when its first step ended) run fault-free under
``torchrun`` and under ``trainguard run`` (default settings but ``--no-health-checks``, as above), paired and
alternating, ``--first-step-reps`` times each; per run the time from the launcher's start to rank 0's first
step, and per pair the difference. The load average before and after is printed with them.

    .venv/bin/python benchmarks/overhead_unmodified.py [--reps 5] [--steps 300] [--width 512]
    .venv/bin/python benchmarks/overhead_unmodified.py --only first-step --first-step-reps 3

Prints one JSON object. Goals: < 1 % of step time, < 50 ms of interpreter start-up (issue "any training
script"), < 1 s added to the time to first step (issue 35).
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
USER = ROOT / "tests" / "e2e" / "userscripts"


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


def _first_step_script(name: str, tmp: Path, timing: Path) -> list[str]:
    if name == "fabric":
        return [str(USER / "fabric_loop.py"), "--steps", "3", "--ckpt-dir", str(tmp / "ckpt"), "--ckpt-every", "100",
                "--width", "256", "--step-seconds", "0", "--export", "", "--timing-log", str(timing)]
    data = tmp / "data.txt"
    if not data.exists():
        data.write_text(" ".join(["the quick brown fox jumps over a lazy dog"] * 500))
    return [str(USER / "hf_clm.py"), "--train_file", str(data), "--output_dir", str(tmp / "out"), "--do_train",
            "--max_steps", "3", "--save_steps", "100", "--use_cpu", "--ddp_backend", "gloo", "--report_to", "none",
            "--per_device_train_batch_size", "4", "--disable_tqdm", "true", "--timing_log", str(timing)]


def first_step_run(name: str, under_trainguard: bool, args: argparse.Namespace, tmp: Path) -> float:
    """Seconds from the launcher's start to the end of rank 0's first step (the script's own clock)."""
    tag = os.urandom(4).hex()
    work = tmp / f"{name}-{tag}"
    work.mkdir()
    timing = work / "timing"
    script = _first_step_script(name, work, timing)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    if under_trainguard:
        cmd = [sys.executable, "-m", "trainguard", "run", "--standalone", "--nproc-per-node", str(args.ranks),
               "--run-dir", str(work / "run"), "--no-health-checks", "--quiet", *script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks),
               *script]
    start = time.time()
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=900, cwd=work)
    records = [json.loads(line) for line in Path(f"{timing}.0").read_text().splitlines()]
    return next(r["end"] for r in records if r["what"] == "first_step") - start


def first_step_overhead(args: argparse.Namespace) -> dict[str, object]:
    load_before = os.getloadavg()
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as d:
        for name in ("fabric", "hf"):
            bare: list[float] = []
            guarded: list[float] = []
            for i in range(args.first_step_reps):
                for flag in ((True, False) if i % 2 == 0 else (False, True)):
                    (guarded if flag else bare).append(first_step_run(name, flag, args, Path(d)))
            added = [g - b for g, b in zip(guarded, bare, strict=True)]
            out[name] = {"torchrun_seconds": [round(x, 3) for x in bare],
                         "trainguard_seconds": [round(x, 3) for x in guarded],
                         "per_pair_added_seconds": [round(x, 3) for x in added],
                         "median_added_seconds": round(statistics.median(added), 3),
                         "median_torchrun_seconds": round(statistics.median(bare), 3)}
    out["load_average_before"] = [round(x, 2) for x in load_before]
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    out["target_added_seconds"] = 1.0
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--width", type=int, default=512, help="MLP width: sets the step's compute time")
    p.add_argument("--startup-reps", type=int, default=15)
    p.add_argument("--first-step-reps", type=int, default=3, help="pairs per script for the time to first step")
    p.add_argument("--only", choices=("all", "steps", "first-step"), default="all")
    args = p.parse_args()
    if args.only == "first-step":
        print(json.dumps({"benchmark": "time to first step: trainguard run vs torchrun (Fabric, HF Trainer)",
                          "ranks": args.ranks, "time_to_first_step": first_step_overhead(args)}, indent=2))
        return 0
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
    first_step = first_step_overhead(args) if args.only == "all" else None
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
        "time_to_first_step": first_step,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
