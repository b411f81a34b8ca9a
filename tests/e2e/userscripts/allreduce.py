"""A plain gloo job that knows nothing of any supervisor: a few all-reduce steps, one line per step.

Prints ``out rank=R step=S sum=X`` on stdout and ``err rank=R step=S`` on stderr, so tests can tell
streams and ranks apart. Options: --steps N (default 3), --sleep SECONDS between steps (default 0.05).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.05)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(1, args.steps + 1):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        print(f"out rank={rank} step={step} sum={t.item():g} world={world} "
              f"local={os.environ.get('LOCAL_RANK')} role={os.environ.get('ROLE_NAME')} "
              f"run_id={os.environ.get('TORCHELASTIC_RUN_ID')}", flush=True)
        print(f"err rank={rank} step={step}", file=sys.stderr, flush=True)
        time.sleep(args.sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
