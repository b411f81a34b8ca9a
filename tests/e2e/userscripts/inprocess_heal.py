"""A data-parallel loop written for in-process restart with live healing (`trainguard.Replica`).

Model and optimizer are kept across re-entries (`Replica.keep`); after a peer fails, the survivors go on from
the step they finished and the new rank takes their state (`Replica.heal`). Only when no rank holds a live
state does it read its checkpoint (rank 0, torch.save every ``--ckpt-every`` steps). By default the survivors
train on by themselves until the new rank arrives; ``--wait-for-new-ranks`` makes them wait (the fault-free
trajectory). ``--no-heal`` restores from the checkpoint on every entry, as a script without a replica does.
Prints, per rank, where each entry started and its final loss on a fixed batch, and ``final loss X`` on rank 0.
"""

import argparse
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import trainguard

replica: trainguard.Replica[tuple[torch.nn.Module, torch.optim.Optimizer]] = trainguard.Replica(
    keep_training="--wait-for-new-ranks" not in sys.argv)


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def restore(path: str, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    if not os.path.exists(path):
        return 0
    saved = torch.load(path, weights_only=True)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    return int(saved["step"])


@trainguard.restartable(backend="gloo")
def train(args: argparse.Namespace) -> float:
    rank = dist.get_rank()  # renumbered while the survivors train on by themselves
    name = os.environ["RANK"]  # the rank's own number, for the lines it prints
    worker = trainguard.attach()
    model, opt = replica.keep(build) if not args.no_heal else build()
    path = os.path.join(args.ckpt_dir, "last.pt")
    healed = None
    if not args.no_heal:
        msd, osd = get_state_dict(model, opt)
        state: dict[str, Any] = {"model": msd, "optim": osd}
        healed = replica.heal(state)
        if healed is not None and replica.last is not None and replica.last.received:
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if healed is not None:
        start = healed
        assert replica.last is not None
        print(f"rank {name}: attempt {worker.attempt} healed to step {start} from rank {replica.last.source}"
              f" (received {replica.last.received})", flush=True)
    else:
        start = restore(path, model, opt)
        print(f"rank {name}: attempt {worker.attempt} restored step {start} from the checkpoint", flush=True)
    for step in range(start + 1, args.steps + 1):
        with worker.step(step):
            gen = torch.Generator().manual_seed(step * 10 + rank)
            x = torch.randn(16, 8, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            offset = 0
            for p in model.parameters():
                assert p.grad is not None
                p.grad.copy_(flat[offset: offset + p.numel()].view_as(p))
                offset += p.numel()
            opt.step()
            time.sleep(args.step_seconds)
        replica.completed(step)  # after the step's record: the survivors may leave their interim group here
        if step % args.ckpt_every == 0:
            dist.barrier()  # every rank finished the step before rank 0 saves it
            if rank == 0:
                os.makedirs(args.ckpt_dir, exist_ok=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()
    with torch.no_grad():  # the final state's loss on a fixed batch: the same on every rank that holds it
        x = torch.randn(64, 8, generator=torch.Generator().manual_seed(99))
        final = float(torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)))
    print(f"rank {name}: attempt {worker.attempt} final loss {final:.9f}", flush=True)
    worker.close()
    return final


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--ckpt-every", type=int, default=1000)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--no-heal", action="store_true")
    p.add_argument("--wait-for-new-ranks", action="store_true")
    args = p.parse_args()
    torch.use_deterministic_algorithms(True)
    loss = train(args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"final loss {loss:.9f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
