"""A plain DDP loop (CPU, gloo) that has never heard of trainguard, with two long phases without collectives.

Mid-training every rank evaluates for ``--eval-seconds`` (forward passes only, no collective); at the end rank 0
writes the final weights through ``gzip`` (a slow save: seconds, more on a loaded host) while the other ranks
wait for it in a barrier: the pattern of every script that saves its model on one rank. The model is wide
enough for DDP to reduce its gradients in several buckets.

    torchrun --nproc-per-node 2 eval_and_export.py --steps 6 --eval-at 3 --export model_final.pt.gz
"""

from __future__ import annotations

import argparse
import gzip
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--eval-at", type=int, default=3)
    p.add_argument("--eval-seconds", type=float, default=8.0)
    p.add_argument("--export", default="model_final.pt.gz")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    hidden = [m for _ in range(args.layers) for m in (torch.nn.Linear(args.width, args.width), torch.nn.ReLU())]
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(), *hidden,
                                    torch.nn.Linear(args.width, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(1234 + rank)
    for step in range(1, args.steps + 1):
        x = torch.randn(8, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == args.eval_at:
            start, batches = time.monotonic(), 0
            with torch.no_grad():
                while time.monotonic() - start < args.eval_seconds:
                    model.module(torch.randn(4, 16, generator=gen))
                    batches += 1
            print(f"rank {rank}: evaluated {batches} batches in {time.monotonic() - start:.1f}s", flush=True)
    if rank == 0:
        start = time.monotonic()
        with gzip.open(args.export, "wb", compresslevel=9) as fh:
            torch.save(model.module.state_dict(), fh)
        print(f"rank 0: exported in {time.monotonic() - start:.1f}s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
