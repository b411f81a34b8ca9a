"""A tiny DDP training script that knows nothing of trainguard: the subject of the automatic-hook tests.

It must never import trainguard. Launched with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT in the environment.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--state", default="", help="resume from / save to this file (model + optimizer)")
parser.add_argument("--no-destroy", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 2))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
if args.state and os.path.exists(args.state):
    saved = torch.load(args.state)
    model.module.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
gen = torch.Generator().manual_seed(rank)
for _ in range(args.steps):
    x = torch.randn(8, 4, generator=gen)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(args.step_sleep)
if args.state and rank == 0:
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict()}, args.state)
dist.barrier()
if not args.no_destroy:
    dist.destroy_process_group()
print("done", flush=True)
