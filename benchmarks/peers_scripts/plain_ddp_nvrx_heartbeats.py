"""tests/e2e/unmodified/plain_ddp.py with nvidia-resiliency-ext's heartbeat client added, as NVRx documents it.

The training loop, checkpoint and step log are those of plain_ddp.py. What NVRx asks of a script: a
``RankMonitorClient`` initialised after the process group, a heartbeat per iteration, the heartbeat timeouts
computed from the observed intervals once enough were seen (``--hb-calc-step``; NVRx's example does it after
the first epoch, or after a few iterations in its quick mode) and kept in the checkpoint (``ft_state``), so a
restarted job detects hangs from its first step. Run it under ``ft_launcher`` (benchmarks/peers.py).
"""

import argparse
import json
import os
import signal
import time

import nvidia_resiliency_ext.fault_tolerance as fault_tolerance
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--crash-rank", type=int, default=-1)
    p.add_argument("--crash-step", type=int, default=0)
    p.add_argument("--step-log", default="")
    p.add_argument("--hb-calc-step", type=int, default=20, help="compute the heartbeat timeouts after this step")
    args = p.parse_args()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ft_client = fault_tolerance.RankMonitorClient()
    ft_client.init_workload_monitoring()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    path = os.path.join(args.ckpt_dir, "last.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path, weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        ft_client.load_state_dict(state["ft_state"])
        start = int(state["step"])
        print(f"rank {rank}: resumed from step {start}", flush=True)
    gen = torch.Generator().manual_seed(1234 + rank)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(64, 16, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_seconds)
        ft_client.send_heartbeat()
        if not ft_client.hb_timeouts.are_valid and step >= start + args.hb_calc_step:
            ft_client.calculate_and_set_hb_timeouts()
            print(f"rank {rank}: heartbeat timeouts {ft_client.hb_timeouts}", flush=True)
        if args.step_log:
            with open(f"{args.step_log}.{rank}", "a") as log:
                log.write(json.dumps({"restart": restart, "rank": rank, "step": step, "time": time.time()}) + "\n")
        if rank == args.crash_rank and restart == 0 and step == args.crash_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if step % args.ckpt_every == 0 and rank == 0:
            os.makedirs(args.ckpt_dir, exist_ok=True)
            tmp = path + ".tmp"
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step,
                        "ft_state": ft_client.state_dict()}, tmp)
            os.replace(tmp, path)
    dist.barrier()
    ft_client.shutdown_workload_monitoring()
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
