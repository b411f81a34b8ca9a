"""A plain DDP loop written for torchrun (CPU, gloo) that has never heard of trainguard; it checkpoints itself.

``--save-with torch``: rank 0 writes ``{"model", "optimizer", "step"}`` with ``torch.save`` to ``last.pt``
(through a temporary file) and every rank restores it with ``torch.load`` and ``load_state_dict``.
``--save-with dcp``: every rank takes part in ``torch.distributed.checkpoint.save`` of ``step-N`` folders and
restores the newest with ``dcp.load`` and ``set_state_dict``, as in PyTorch's distributed checkpoint recipe.
At the end rank 0 exports the model's weights (``model_final.pt``). ``--timing-log`` appends this script's
own timing of each save and restore (wall clock) to ``FILE.<rank>``: ``save`` from the state dict's making to the
file in place, ``save_call`` the save's own calls (``torch.save``; ``get_state_dict`` and ``dcp.save``).

    torchrun --nproc-per-node 2 plain_loop.py --steps 30 --ckpt-dir ckpt --ckpt-every 10 --save-with dcp
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


def log_timing(path: str, what: str, step: int, start: float, end: float) -> None:
    if path:
        with open(f"{path}.{dist.get_rank()}", "a") as fh:
            fh.write(json.dumps({"what": what, "step": step, "start": start, "end": end,
                                 "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}) + "\n")


def newest_dcp(ckpt_dir: str) -> str | None:
    steps = [int(name[5:]) for name in os.listdir(ckpt_dir) if name.startswith("step-")] if os.path.isdir(
        ckpt_dir) else []
    return os.path.join(ckpt_dir, f"step-{max(steps)}") if steps else None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--save-with", choices=("torch", "dcp"), default="torch")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--export", default="model_final.pt")
    p.add_argument("--timing-log", default="")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(),
                                    torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                    torch.nn.Linear(args.width, 1)))
    if args.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    last = os.path.join(args.ckpt_dir, "last.pt")
    start = 0
    t0 = time.time()
    if args.save_with == "torch" and os.path.exists(last):
        state = torch.load(last, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
    elif args.save_with == "dcp" and newest_dcp(args.ckpt_dir) is not None:
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optimizer": optim_sd, "step": 0}
        dcp.load(state, checkpoint_id=newest_dcp(args.ckpt_dir))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        start = int(state["step"])
    if start:
        log_timing(args.timing_log, "load", start, t0, time.time())
        print(f"rank {rank}: resumed from step {start}", flush=True)
    gen = torch.Generator().manual_seed(1234 + rank)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(32, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_seconds)
        if step % args.ckpt_every == 0:
            t0 = time.time()
            if args.save_with == "dcp":
                model_sd, optim_sd = get_state_dict(model, opt)
                dcp.save({"model": model_sd, "optimizer": optim_sd, "step": step},
                         checkpoint_id=os.path.join(args.ckpt_dir, f"step-{step}"))
                t1 = time.time()
                log_timing(args.timing_log, "save_call", step, t0, t1)  # DCP's state dict is part of its save
                log_timing(args.timing_log, "save", step, t0, t1)
            elif rank == 0:
                os.makedirs(args.ckpt_dir, exist_ok=True)
                state = {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step}
                t1 = time.time()
                torch.save(state, last + ".tmp")
                log_timing(args.timing_log, "save_call", step, t1, time.time())
                os.replace(last + ".tmp", last)
                log_timing(args.timing_log, "save", step, t0, time.time())
        if step % 10 == 0 and rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0 and args.export:
        torch.save(model.module.state_dict(), args.export)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: done at step {args.steps}", flush=True)


if __name__ == "__main__":
    main()
