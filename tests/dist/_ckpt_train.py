"""A tiny deterministic data-parallel training job on gloo that checkpoints with trainguard, for chaos tests.

Run as a script, one process per rank (``launch`` starts them). Faults (``--fault``):
``kill-write`` (rank SIGKILLs itself while writing its shard of ``--fault-step``), ``stop-write``
(it SIGSTOPs itself there: a hung writer), ``kill-commit``
(rank 0 SIGKILLs itself after writing the manifest, before the rename), ``enospc`` (the rank's disk
"fills" during that save). The result (start step, per-step losses) goes to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



class TinyJob:
    """The tiny deterministic model, optimizer and per-rank data stream the checkpoint test jobs train
    (this script's and `_memtier_train`'s): one gloo all-reduce of the gradients per step."""

    def __init__(self, rank: int, world: int) -> None:
        import torch

        torch.manual_seed(0)
        self.world = world
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        for p in self.model.parameters():  # initialised optimizer state, so its structure matches checkpoints
            self.opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
        self.gen = torch.Generator().manual_seed(1000 + rank)  # per-rank data stream: rank-local state

    def snapshot(self, step: int) -> dict:
        return {
            "model": self.model.state_dict(),
            "optim": self.opt.state_dict(),
            "step": step,
            "rank_local": {"rng": self.gen.get_state(), "position": step},
        }

    def restore(self, ckpt: Any) -> int:
        """Restore from ``ckpt`` (a `trainguard.Checkpointer`); the step restored, 0 for none."""
        state = self.snapshot(0)
        start = ckpt.restore(state) or 0
        if start:
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optim"])
            self.gen.set_state(state["rank_local"]["rng"])
            assert state["rank_local"]["position"] == start == state["step"], state
        return int(start)

    def step(self) -> float:
        """One training step; the loss averaged over the ranks."""
        import torch
        import torch.distributed as dist

        x = torch.randn(4, 8, generator=self.gen)
        y = (x.sum(dim=1, keepdim=True) * 0.5).sin()
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= self.world
        self.opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return float(total) / self.world

def launch(
    tmp: Path,
    ckpt_dir: Path,
    *,
    world: int = 2,
    steps: int = 8,
    save_every: int = 2,
    fault: str = "",
    fault_step: int = 0,
    fault_rank: int = 0,
    timeout_seconds: float = 90.0,
    tag: str = "run",
    ckpt_timeout_seconds: float = 30.0,
) -> tuple[list[int | None], list[dict]]:
    """Start ``world`` ranks; when one fails the others are killed a second later (like torchrun).

    Returns (exit codes, outputs)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    procs, outs = [], []
    for rank in range(world):
        out = tmp / f"{tag}-rank{rank}.json"
        outs.append(out)
        log = (tmp / f"{tag}-rank{rank}.log").open("wb")
        cmd = [
            sys.executable,
            __file__,
            "--rank",
            str(rank),
            "--world",
            str(world),
            "--port",
            str(port),
            "--dir",
            str(ckpt_dir),
            "--steps",
            str(steps),
            "--save-every",
            str(save_every),
            "--out",
            str(out),
            "--events",
            str(tmp / f"{tag}-events-rank{rank}.jsonl"),
            "--ckpt-timeout",
            str(ckpt_timeout_seconds),
        ]
        if fault:
            cmd += ["--fault", fault, "--fault-step", str(fault_step), "--fault-rank", str(fault_rank)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout_seconds
    failed_at: float | None = None
    while any(p.poll() is None for p in procs):
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = time.monotonic()
        if (failed_at is not None and time.monotonic() - failed_at > 1.0) or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    codes = [p.wait() for p in procs]
    results = [json.loads(o.read_text()) if o.exists() else {} for o in outs]
    return codes, results


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("--rank", "--world", "--port", "--steps", "--save-every", "--fault-step", "--fault-rank"):
        ap.add_argument(name, type=int, default=0)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--events", default="")
    ap.add_argument("--fault", default="")
    ap.add_argument("--ckpt-timeout", type=float, default=30.0)
    args = ap.parse_args()

    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from trainguard.checkpoint import CheckpointConfig, Checkpointer, CheckpointError, IntervalPolicy, WriteHooks
    from trainguard.core.eventlog import EventWriter

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=60),
    )
    mine = args.fault and args.rank == (0 if args.fault == "kill-commit" else args.fault_rank)

    class StepFaults(WriteHooks):
        """Faults that hit only the save of ``--fault-step`` (identified by its staging directory)."""

        budget = 300  # bytes that still fit on the "disk" for the enospc fault

        def before_write(self, path: Path, size: int) -> int:
            if not path.parent.name.startswith(f".staging-step-{args.fault_step}-"):
                return size
            if args.fault == "kill-write":
                os.kill(os.getpid(), signal.SIGKILL)
            if args.fault == "stop-write":  # a hung writer: alive, silent
                os.kill(os.getpid(), signal.SIGSTOP)
            if args.fault == "enospc":
                granted = min(size, self.budget)
                self.budget -= granted
                return granted
            return size

        def before_commit(self, staging: Path, step: int) -> None:
            if args.fault == "kill-commit" and step == args.fault_step:
                os.kill(os.getpid(), signal.SIGKILL)

    hooks = StepFaults()
    events = EventWriter(args.events) if args.events else None
    config = CheckpointConfig(
        keep_last=10, interval=IntervalPolicy.every_steps(args.save_every), timeout_seconds=args.ckpt_timeout
    )
    ckpt = Checkpointer(args.dir, config, events=events, hooks=hooks if mine else None)
    job = TinyJob(args.rank, args.world)
    start = job.restore(ckpt)
    losses: dict[int, float] = {}
    result = {"start": start, "losses": losses, "error": ""}
    code = 0
    try:
        for step in range(start + 1, args.steps + 1):
            losses[step] = job.step()
            if ckpt.should_save(step):
                ckpt.save(step, job.snapshot(step))
        ckpt.close()
    except CheckpointError as exc:
        result["error"] = str(exc)
        code = 3
    Path(args.out).write_text(json.dumps(result))
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
