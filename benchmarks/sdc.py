"""Cost of the silent-data-corruption check at its default interval, side by side with the same steps unchecked.

Starts ``--ranks`` gloo ranks (this file with ``--worker``) that train the demo's GPT
(trainguard/examples/train_gpt.py's model and data, its default size) data-parallel, in alternating blocks of
``--block`` steps: a block without the check, then a block with `trainguard.sdc.check.SdcChecker` called
after every update at interval ``--every`` (default: trainguard run's default; a block is K steps by default,
so each checked block holds exactly one check), ``--pairs`` times. Rank 0 reports:

* each block's mean step time (the check's cost is in the mean, not the median: it runs once per K steps);
  the side-by-side overhead is the median over pairs of (checked mean / unchecked mean - 1), noisy on a
  shared machine;
* the check's own time (fingerprint of every parameter + the all-gather on its gloo group), timed around
  each check; ``overhead_at_k`` = median check time / (K x median unchecked step time), which the machine's
  load disturbs less.

    .venv/bin/python benchmarks/sdc.py [--ranks 3] [--pairs 7] [--block K] [--every 100]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from trainguard.examples import train_gpt  # the demo's model and data
    from trainguard.sdc.check import SdcChecker, fingerprint

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    targs = train_gpt.parse_args([])
    targs.vocab, targs.d_model, targs.layers, targs.heads, targs.seq, targs.batch = 128, 128, 2, 4, 64, 8
    torch.manual_seed(0)
    model = train_gpt.GPT(targs.vocab, targs.d_model, targs.layers, targs.heads, targs.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    params = [p for p in model.parameters() if p.requires_grad]
    rt = SimpleNamespace(env=SimpleNamespace(pg_timeout_seconds=600.0, agent_pid=None, run_dir=None),
                         attempt=0, source="script", set_phase=lambda name: None)
    checker = SdcChecker(rt, args.every)
    checker.track(opt)
    check_seconds: list[float] = []

    def step(n: int, checked: bool) -> None:
        x, y = train_gpt.batch_for(n, rank, targs)
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x).reshape(-1, targs.vocab), y.reshape(-1))
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
        if checked:
            t0 = time.perf_counter()
            before = checker.checks
            checker.on_step(n)
            if checker.checks > before:
                check_seconds.append(time.perf_counter() - t0)

    n = 0
    for _ in range(20):  # warm-up; the checker's group is created on its first call, outside the timing
        n += 1
        step(n, checked=False)
    checker.on_step(n if n % args.every else n + 1)
    blocks: list[tuple[str, float]] = []
    for _ in range(args.pairs):
        for checked in (False, True):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.block):
                n += 1
                step(n, checked)
            blocks.append(("on" if checked else "off", (time.perf_counter() - t0) / args.block))
    t0 = time.perf_counter()
    for _ in range(20):
        fingerprint(params)
    fp_seconds = (time.perf_counter() - t0) / 20
    if checker.off:
        raise SystemExit("the check turned itself off")
    if rank == 0:
        off = [s for k, s in blocks if k == "off"]
        on = [s for k, s in blocks if k == "on"]
        ratios = [b / a - 1 for a, b in zip(off, on, strict=True)]
        step_s = statistics.median(off)
        check_s = statistics.median(check_seconds) if check_seconds else float("nan")
        out = {
            "ranks": world, "parameters": sum(p.numel() for p in params), "every": args.every,
            "block_steps": args.block, "pairs": args.pairs,
            "step_seconds_unchecked": [round(s, 6) for s in off],
            "step_seconds_checked": [round(s, 6) for s in on],
            "side_by_side_overhead": round(statistics.median(ratios), 5),
            "side_by_side_overhead_per_pair": [round(r, 5) for r in ratios],
            "checks": len(check_seconds),
            "check_seconds_median": round(check_s, 6),
            "fingerprint_seconds": round(fp_seconds, 6),
            "overhead_at_k": round(check_s / (args.every * step_s), 6),
            "under_1_percent": check_s / (args.every * step_s) < 0.01,
        }
        Path(args.out).write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--block", type=int, default=None, help="steps per block (default: the interval)")
    p.add_argument("--every", type=int, default=None, help="check interval (default: trainguard run's default)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.every is None:
        from trainguard.sdc.verdict import DEFAULT_CHECK_EVERY

        args.every = DEFAULT_CHECK_EVERY
    if args.block is None:
        args.block = args.every
    if args.worker:
        _worker(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        procs: list[subprocess.Popen[Any]] = []
        for rank in range(args.ranks):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(args.ranks), "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            env.pop("TRAINGUARD_SDC_EVERY", None)
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--out", str(out),
                                           "--every", str(args.every), "--pairs", str(args.pairs),
                                           "--block", str(args.block)], env=env))
        codes = [proc.wait() for proc in procs]
        if any(codes) or not out.exists():
            raise SystemExit(f"benchmark ranks failed: exit codes {codes}")
        print(json.dumps(json.loads(out.read_text()), indent=2))


if __name__ == "__main__":
    main()
