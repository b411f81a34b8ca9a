"""A Lightning Fabric loop written for torchrun (CPU, gloo) that has never heard of trainguard.

It follows Fabric's documented checkpointing: the state is ``{"model", "optimizer", "step"}``, saved with
``fabric.save(path, state)`` every ``--ckpt-every`` steps to ``checkpoint.ckpt`` and restored in place with
``fabric.load(path, state)``. ``--optimizer sgd`` uses plain SGD, which keeps no step count. At the end rank 0
exports the model's weights with ``torch.save`` (``model_final.pt``). ``--timing-log`` appends the script's own
timing of each save and load, and the end of the first step this process completed (wall clock), to
``FILE.<rank>``.

    torchrun --nproc-per-node 2 fabric_loop.py --steps 30 --ckpt-dir ckpt --ckpt-every 10
"""

from __future__ import annotations

import argparse
import json
import os
import time

import lightning as L
import torch


def log_timing(fabric: L.Fabric, path: str, what: str, step: int, start: float, end: float) -> None:
    if path:
        with open(f"{path}.{fabric.global_rank}", "a") as fh:
            fh.write(json.dumps({"what": what, "step": step, "start": start, "end": end}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--export", default="model_final.pt")
    p.add_argument("--timing-log", default="")
    args = p.parse_args()
    start = time.time()
    fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                      num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", 1)))
    fabric.launch()
    fabric.seed_everything(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 1))
    if args.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = fabric.setup(model, optimizer)
    state = {"model": model, "optimizer": optimizer, "step": 0}
    path = os.path.join(args.ckpt_dir, "checkpoint.ckpt")
    if os.path.exists(path):
        t0 = time.time()
        fabric.load(path, state)
        log_timing(fabric, args.timing_log, "load", state["step"], t0, time.time())
        fabric.print(f"resumed from step {state['step']}")
    gen = torch.Generator().manual_seed(1234 + fabric.global_rank)
    first_logged = False
    while state["step"] < args.steps:
        x = torch.randn(32, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        time.sleep(args.step_seconds)
        state["step"] += 1
        if not first_logged:  # the first step this process completed: step 1, or the first after a resume
            first_logged = True
            log_timing(fabric, args.timing_log, "first_step", state["step"], start, time.time())
        if state["step"] % args.ckpt_every == 0:
            t0 = time.time()
            fabric.save(path, state)
            log_timing(fabric, args.timing_log, "save", state["step"], t0, time.time())
        if state["step"] % 10 == 0:
            fabric.print(f"step {state['step']} loss {loss.item():.4f}")
    if fabric.global_rank == 0 and args.export:
        torch.save(model.state_dict(), args.export)
    fabric.barrier()
    print(f"rank {fabric.global_rank}: done at step {state['step']}", flush=True)


if __name__ == "__main__":
    main()
