"""tests/e2e/unmodified/plain_ddp.py rewritten for trainguard's live healing (``trainguard run --in-process``).

The whole training is a `trainguard.restartable` function; the model and optimizer are kept across its re-entries
(`trainguard.Replica.keep`), so after rank 1 dies the survivor goes on from the step it finished and rank 1's new
process takes the survivor's state (`trainguard.Replica.heal`), not a checkpoint's: the counterpart of the torchft
copy beside it. It still saves every ``--ckpt-every`` steps for a whole-process restart. The step log has
plain_ddp.py's lines; ``restart`` is the attempt the step belongs to.
"""

import argparse
import json
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

import trainguard

replica: Any = trainguard.Replica()


def build(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


@trainguard.restartable(backend="gloo")
def train(args: argparse.Namespace) -> None:
    rank = dist.get_rank()
    worker = trainguard.attach()
    attempt = worker.attempt
    module, opt = replica.keep(lambda: build(args.width))
    msd, osd = get_state_dict(module, opt)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    start = replica.heal(state)
    if start is not None:
        set_state_dict(module, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        start = 0
        path = os.path.join(args.ckpt_dir, "last.pt")
        if os.path.exists(path):
            saved = torch.load(path, weights_only=True)
            module.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            start = int(saved["step"])
    model = DDP(module)
    for step in range(start + 1, args.steps + 1):
        with worker.step(step):  # after attach() the script's own steps are its progress (docs/run.md)
            gen = torch.Generator().manual_seed(1234 + 1000 * step + rank)
            x = torch.randn(64, 16, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(args.step_seconds)
        if args.step_log:
            with open(f"{args.step_log}.{rank}", "a") as log:
                log.write(json.dumps({"restart": attempt, "rank": rank, "step": step, "time": time.time()}) + "\n")
        if rank == args.crash_rank and attempt == 0 and step == args.crash_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if step % args.ckpt_every == 0 and rank == 0:
            os.makedirs(args.ckpt_dir, exist_ok=True)
            torch.save({"model": module.state_dict(), "opt": opt.state_dict(), "step": step},
                       os.path.join(args.ckpt_dir, "last.tmp"))
            os.replace(os.path.join(args.ckpt_dir, "last.tmp"), os.path.join(args.ckpt_dir, "last.pt"))
        replica.completed(step)  # the step's end (no collective since opt.step): survivors may regroup here
    dist.barrier()
    print(f"rank {rank}: done", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--crash-rank", type=int, default=-1, help="this rank kills itself in the first attempt")
    p.add_argument("--crash-step", type=int, default=0)
    p.add_argument("--step-log", default="")
    train(p.parse_args())


if __name__ == "__main__":
    main()
