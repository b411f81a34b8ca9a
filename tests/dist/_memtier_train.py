"""A tiny deterministic 2-rank gloo job with trainguard's memory tier on, one "node" id per rank, for fault tests.

Storage saves every ``--save-every`` steps, memory copies every step. Faults (``--fault``, on
``--fault-rank``): ``crash`` (the rank dies in step ``--fault-step + 1``, after the copy of
``--fault-step`` finished), ``kill-mid-copy`` (the rank scribbles over half of the slot its copy of
``--fault-step`` is overwriting, then SIGKILLs itself). The result (start step, restore tier, bytes read
from storage, per-step losses) goes to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _ckpt_train import ROOT, TinyJob, free_port

SECRET = "memory-tier-test-secret-0123456789"


def launch(
    tmp: Path, ckpt_dir: Path, shm: Path, nodes: list[str], *, steps: int = 8, save_every: int = 4,
    fault: str = "", fault_step: int = 0, fault_rank: int = 0, tag: str = "run", timeout_seconds: float = 120.0,
    placement: str = "",
) -> tuple[list[int | None], list[dict]]:
    """Start one rank per entry of ``nodes`` (its node id); when one fails the others are killed a second later."""
    port = free_port()
    procs, outs = [], []
    for rank, node in enumerate(nodes):
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "TRAINGUARD_NODE": node,
               "TRAINGUARD_JOB_SECRET": SECRET}
        out = tmp / f"{tag}-rank{rank}.json"
        outs.append(out)
        log = (tmp / f"{tag}-rank{rank}.log").open("wb")
        cmd = [sys.executable, __file__, "--rank", str(rank), "--world", str(len(nodes)), "--port", str(port),
               "--dir", str(ckpt_dir), "--shm", str(shm), "--steps", str(steps), "--save-every", str(save_every),
               "--out", str(out), "--fault", fault, "--fault-step", str(fault_step), "--fault-rank", str(fault_rank),
               "--placement", placement]
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
    return codes, [json.loads(o.read_text()) if o.exists() else {} for o in outs]


def main() -> int:
    ap = argparse.ArgumentParser()
    for name in ("--rank", "--world", "--port", "--steps", "--save-every", "--fault-step", "--fault-rank"):
        ap.add_argument(name, type=int, default=0)
    for name in ("--dir", "--shm", "--out"):
        ap.add_argument(name, required=True)
    ap.add_argument("--fault", default="")
    ap.add_argument("--placement", default="")
    args = ap.parse_args()

    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from trainguard.checkpoint import CheckpointConfig, Checkpointer, IntervalPolicy, WriteHooks

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=timedelta(seconds=60))
    mine = args.rank == args.fault_rank

    class MidCopy(WriteHooks):
        def during_memory_copy(self, step: int, slot: memoryview) -> None:
            if args.fault == "kill-mid-copy" and mine and step == args.fault_step:
                slot[:] = b"\xff" * len(slot)
                os.kill(os.getpid(), signal.SIGKILL)

    config = CheckpointConfig(
        keep_last=10, interval=IntervalPolicy.every_steps(args.save_every), timeout_seconds=30.0,
        memory_gb=0.05, memory_every_steps=1, memory_root=args.shm, memory_address="127.0.0.1",
        memory_placement=args.placement or None,
    )
    class Records:  # the checkpointer's events, kept for the result
        def __init__(self) -> None:
            self.kept: list = []

        def write(self, record: object) -> None:
            self.kept.append(record)

    records = Records()
    ckpt = Checkpointer(args.dir, config, hooks=MidCopy(), events=records)  # type: ignore[arg-type]
    job = TinyJob(args.rank, args.world)
    start = job.restore(ckpt)
    tier = ckpt.last_restore.tier if ckpt.last_restore else ("storage" if start else "")
    losses: dict[int, float] = {}
    result = {"start": start, "tier": tier, "storage_bytes": ckpt.last_restore_storage_bytes, "losses": losses}
    for step in range(start + 1, args.steps + 1):
        if args.fault == "crash" and mine and step == args.fault_step + 1:
            ckpt.wait()  # the copy of the step before finished (checksum and replica): then the rank dies
            os.kill(os.getpid(), signal.SIGKILL)
        losses[step] = job.step()
        if ckpt.should_save(step):
            ckpt.save(step, job.snapshot(step))
        elif ckpt.should_save_to_memory(step):
            ckpt.save_to_memory(step, job.snapshot(step))
    ckpt.close()
    result["loaded_tiers"] = [r.tier for r in records.kept if r.TYPE == "checkpoint_loaded"]
    result["copy_paths"] = sorted({r.path for r in records.kept if r.TYPE == "checkpoint_save_finished" and r.tier})
    Path(args.out).write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
