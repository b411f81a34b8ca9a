"""The reference GPT workload written for in-process restart (``trainguard run --in-process``).

The same model, data and checkpoints as ``train_gpt.py``; the difference is the shape: the whole training
(build, restore, loop) is one function decorated with `trainguard.restartable`, which
creates the process group itself. After a peer fails, the surviving ranks call the function again in the
same interpreter (torch stays imported) and it resumes from the newest checkpoint, so the final loss
equals a fault-free run's. Under plain torchrun it runs once, like any script.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

import trainguard
from trainguard.examples.train_gpt import GPT, batch_for, make_checkpointer, parse_args


def _restore(args: argparse.Namespace, model: GPT, opt: torch.optim.Optimizer, worker: Any, ckpt: Any) -> int:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    with worker.phase("checkpoint"):
        msd, osd = get_state_dict(model, opt)
        state: dict[str, Any] = {"model": msd, "optim": osd, "rng": torch.get_rng_state()}
        restored = ckpt.restore(state)
        if restored is None:
            return 0
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        torch.set_rng_state(state["rng"])
    if dist.get_rank() == 0:
        print(f"train_gpt_inprocess: attempt {worker.attempt} resumed from step {restored}", flush=True)
    return int(restored)


def _step(args: argparse.Namespace, model: GPT, opt: torch.optim.Optimizer, params: list[torch.Tensor],
          step: int, s: Any) -> float:
    rank, world = dist.get_rank(), dist.get_world_size()
    with s.phase("data"):
        x, y = batch_for(step, rank, args)
    with s.phase("forward_backward"):
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
    with s.phase("comm_wait"):
        flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None] + [loss.detach().reshape(1)])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for p in params:
            assert p.grad is not None
            p.grad.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()
    with s.phase("optimizer"):
        opt.step()
    return float(flat[-1])


@trainguard.restartable(backend="gloo")
def train(args: argparse.Namespace) -> float:
    """One attempt of the whole training; returns the final (all-reduced mean) loss."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    worker = trainguard.attach()
    args.ckpt_dir = args.ckpt_dir or os.path.join(str(worker.run_dir), "checkpoints")
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.d_model, args.layers, args.heads, args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    params = [p for p in model.parameters() if p.requires_grad]
    ckpt = make_checkpointer(args, worker)
    start = _restore(args, model, opt, worker, ckpt)
    loss = float("nan")
    for step in range(start + 1, args.steps + 1):
        with worker.step(step) as s:
            loss = _step(args, model, opt, params, step, s)
            s.loss = loss
            if ckpt.should_save(step) and step < args.steps:
                with s.phase("checkpoint"):
                    msd, osd = get_state_dict(model, opt)
                    ckpt.save(step, {"model": msd, "optim": osd, "rng": torch.get_rng_state()})
        if dist.get_rank() == 0 and (step % 10 == 0 or step == args.steps):
            print(f"train_gpt_inprocess: step {step}/{args.steps} loss {loss:.6f}", flush=True)
    with worker.phase("checkpoint"):
        ckpt.wait()
        ckpt.close()
    worker.close()
    dist.barrier()
    return loss


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    loss = train(args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"train_gpt_inprocess: done, final loss {loss:.9f}", flush=True)
    return 0 if math.isfinite(loss) else 1


if __name__ == "__main__":
    sys.exit(main())
