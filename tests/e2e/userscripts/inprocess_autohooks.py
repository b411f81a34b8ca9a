"""An in-process restartable training function that never calls ``trainguard.attach()``.

Its steps are seen only by the automatic optimizer hooks; it keeps its own checkpoint (rank 0, torch.save,
every ``--ckpt-every`` steps) and resumes from it. After a peer fails, the surviving rank re-enters
``train`` in the same interpreter, where ``torch.optim`` is already imported: nothing imports it again.
Prints ``final loss X`` on rank 0.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import trainguard


@trainguard.restartable(backend="gloo")
def train(args: argparse.Namespace) -> float:
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    path = os.path.join(args.ckpt_dir, "last.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        print(f"rank {rank}: resumed from step {start}", flush=True)
    loss = torch.zeros(())
    for step in range(start + 1, args.steps + 1):
        gen = torch.Generator().manual_seed(step * 10 + rank)
        x = torch.randn(16, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        time.sleep(args.step_seconds)
        if step % args.ckpt_every == 0:
            dist.barrier()  # every rank finished the step before rank 0 saves it
            if rank == 0:
                os.makedirs(args.ckpt_dir, exist_ok=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()
    final = loss.detach().clone()
    dist.all_reduce(final)
    return float(final) / dist.get_world_size()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--ckpt-dir", required=True)
    args = p.parse_args()
    loss = train(args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"final loss {loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
