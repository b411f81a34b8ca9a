"""A gloo job whose rank 1 exits with code 3 in the first --fail-attempts attempts (after one
all-reduce), then all ranks finish: restarts without any library in the script."""

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-attempts", type=int, default=1)
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"flaky rank={rank} attempt={attempt} sum={t.item():g}", flush=True)
    if rank == 1 and attempt < args.fail_attempts:
        os._exit(3)  # at once: a normal exit with a live gloo group may abort instead
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
