"""A plain DDP training script written for torchrun; it has never heard of trainguard.

Trains a tiny MLP with AdamW on synthetic data, saves its own checkpoint every --ckpt-every steps with
torch.save (rank 0, atomically) and resumes from it. --eval-every/--eval-seconds add an evaluation
phase with no optimizer step and no collective, as real scripts have. --crash-rank with --crash-step (or a
file --crash-file appearing) makes that rank SIGKILL itself in the first launch only; --stop-file ends
training on every rank at the step after the file appears; --step-log writes each rank's step times, so the
same script is measured under any launcher.
"""

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--eval-seconds", type=float, default=0.0)
    p.add_argument("--width", type=int, default=32, help="hidden width of the MLP")
    p.add_argument("--timing-out", default="", help="rank 0 writes its step times (JSON) here")
    p.add_argument("--linger-rank", type=int, default=-1, help="this rank waits before exiting (slow teardown)")
    p.add_argument("--linger-seconds", type=float, default=0.0)
    p.add_argument("--no-destroy", action="store_true", help="exit without destroy_process_group (many scripts do)")
    p.add_argument("--abort-at-exit-rank", type=int, default=-1,
                   help="this rank's process dies by SIGABRT once its interpreter has finished, as torch's C++ "
                        "teardown can ('terminate called without an active exception')")
    p.add_argument("--freeze-rank", type=int, default=-1,
                   help="this rank freezes holding the GIL once its group is destroyed, as torch's gloo teardown "
                        "can deadlock (pytorch/pytorch#56297)")
    p.add_argument("--crash-rank", type=int, default=-1, help="this rank kills itself in the first launch")
    p.add_argument("--crash-step", type=int, default=0, help="... at this step (0: when --crash-file appears)")
    p.add_argument("--crash-file", default="")
    p.add_argument("--stop-file", default="", help="every rank stops after the step at which this file exists")
    p.add_argument("--step-log", default="", help="each rank appends {restart, rank, step, time} lines to FILE.RANK")
    args = p.parse_args()
    first_launch = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    path = os.path.join(args.ckpt_dir, "last.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        print(f"rank {rank}: resumed from step {start}", flush=True)
    gen = torch.Generator().manual_seed(1234 + rank)
    step_seconds: list[float] = []
    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        x = torch.randn(64, 16, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_seconds)
        step_seconds.append(time.perf_counter() - t0)
        if args.step_log:
            with open(f"{args.step_log}.{rank}", "a") as log:
                log.write(json.dumps({"restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                                      "rank": rank, "step": step, "time": time.time()}) + "\n")
        if rank == args.crash_rank and first_launch and (
                step == args.crash_step or (args.crash_file and os.path.exists(args.crash_file))):
            os.kill(os.getpid(), signal.SIGKILL)
        if args.stop_file:  # every rank stops at the same step: the one at which any rank saw the file
            stop = torch.tensor([float(os.path.exists(args.stop_file))])
            dist.all_reduce(stop)
            if stop.item() > 0:
                break
        if step % args.ckpt_every == 0 and rank == 0:
            os.makedirs(args.ckpt_dir, exist_ok=True)
            tmp = path + ".tmp"
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, path)
        if args.eval_every and step % args.eval_every == 0:
            with torch.no_grad():
                model.module(torch.randn(8, 16))
            time.sleep(args.eval_seconds)
        if step % 10 == 0 and rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if args.timing_out and rank == 0:
        with open(args.timing_out, "w") as fh:
            json.dump({"step_seconds": step_seconds}, fh)
    dist.barrier()
    if not args.no_destroy:
        dist.destroy_process_group()
    if rank == args.freeze_rank:
        import ctypes

        ctypes.PyDLL(None).sleep(3600)  # PyDLL keeps the GIL through the call: no Python thread runs again
    if rank == args.abort_at_exit_rank:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)  # runs after Python's own exit
    if rank == args.linger_rank:
        time.sleep(args.linger_seconds)  # e.g. writing artefacts after training, while the other ranks exited
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
