"""A data-parallel loop that calls `trainguard.attach()` (as a script does for a `Checkpointer` or a `Replica`) but
never times its steps with `worker.step`: its progress is what the optimizer's steps say."""

import argparse
import time

import torch
import torch.distributed as dist

import trainguard


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--step-seconds", type=float, default=0.05)
    args = p.parse_args()
    dist.init_process_group("gloo")
    trainguard.attach()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_seconds)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
