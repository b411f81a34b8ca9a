"""An Accelerate loop written for torchrun (CPU, gloo) that has never heard of trainguard.

It follows Accelerate's checkpointing example (examples/by_feature/checkpointing.py): every ``--ckpt-every``
steps ``accelerator.save_state(<ckpt-dir>/step_<N>)``; on start the newest ``step_<N>`` folder is restored
with ``accelerator.load_state`` and training resumes after step N, the dataloader skipping the batches already
seen. ``--timing-log`` appends the script's own timing of each save and load, and the end of the first step this
process completed (wall clock), to ``FILE.<rank>``.

    torchrun --nproc-per-node 2 accelerate_loop.py --steps 30 --ckpt-dir ckpt --ckpt-every 10
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def log_timing(accelerator: Accelerator, path: str, what: str, step: int, start: float, end: float) -> None:
    if path:
        with open(f"{path}.{accelerator.process_index}", "a") as fh:
            fh.write(json.dumps({"what": what, "step": step, "start": start, "end": end}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--timing-log", default="")
    args = p.parse_args()
    start = time.time()
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 1))
    if args.optimizer == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(32 * 2 * args.steps, 16)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    overall_step = 0
    dirs = [d for d in os.scandir(args.ckpt_dir) if d.is_dir() and d.name.startswith("step_")] if os.path.isdir(
        args.ckpt_dir) else []
    batches = data
    if dirs:
        path = max(dirs, key=lambda d: int(d.name.replace("step_", ""))).path
        accelerator.print(f"Resumed from checkpoint: {path}")
        t0 = time.time()
        accelerator.load_state(path)
        overall_step = int(os.path.basename(path).replace("step_", ""))
        log_timing(accelerator, args.timing_log, "load", overall_step, t0, time.time())
        batches = accelerator.skip_first_batches(data, overall_step)
    model.train()
    first_logged = False
    for inputs, targets in batches:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(args.step_seconds)
        overall_step += 1
        if not first_logged:  # the first step this process completed: step 1, or the first after a resume
            first_logged = True
            log_timing(accelerator, args.timing_log, "first_step", overall_step, start, time.time())
        if overall_step % args.ckpt_every == 0:
            t0 = time.time()
            accelerator.save_state(os.path.join(args.ckpt_dir, f"step_{overall_step}"))
            log_timing(accelerator, args.timing_log, "save", overall_step, t0, time.time())
        if overall_step % 10 == 0:
            accelerator.print(f"step {overall_step} loss {loss.item():.4f}")
        if overall_step >= args.steps:
            break
    accelerator.wait_for_everyone()
    print(f"rank {accelerator.process_index}: done at step {overall_step}", flush=True)


if __name__ == "__main__":
    main()
