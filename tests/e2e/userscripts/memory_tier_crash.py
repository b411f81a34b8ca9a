"""A 2-rank gloo job that checkpoints to storage every 4 steps and (with ``$SHM``) to the memory tier every
step; rank 1 dies in step 7 of the first attempt. Each rank appends what its restore used to ``$OUT/rank-<r>.jsonl``."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from trainguard.checkpoint import CheckpointConfig, Checkpointer, IntervalPolicy

OUT = Path(os.environ["OUT"])


def main() -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if os.environ.get("SHM"):  # the script configures the tier itself, copying every step
        config = CheckpointConfig(interval=IntervalPolicy.every_steps(4), memory_gb=0.05, memory_every_steps=1,
                                  memory_root=os.environ["SHM"], memory_address="127.0.0.1")
    else:  # `trainguard run --memory-checkpoint-gb` turns it on: each storage save is also kept in memory
        config = CheckpointConfig(interval=IntervalPolicy.every_steps(4))
    ckpt = Checkpointer(os.environ["CKPT"], config)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    start = ckpt.restore(state) or 0
    if start:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
    tier = ckpt.last_restore.tier if ckpt.last_restore else ("storage" if start else "")
    with (OUT / f"rank-{rank}.jsonl").open("a") as fh:
        fh.write(json.dumps({"attempt": attempt, "start": start, "tier": tier,
                             "storage_bytes": ckpt.last_restore_storage_bytes}) + "\n")
    for step in range(start + 1, 13):
        if attempt == 0 and rank == 1 and step == 7:
            ckpt.wait()  # step 6's copy is complete (checksummed): then the rank dies
            os.kill(os.getpid(), signal.SIGKILL)
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(4, 8, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        snapshot = {"model": model.state_dict(), "optim": opt.state_dict()}
        if ckpt.should_save(step):
            ckpt.save(step, snapshot)
        elif ckpt.should_save_to_memory(step):
            ckpt.save_to_memory(step, snapshot)
    ckpt.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
