"""tests/e2e/unmodified/plain_ddp.py rewritten for torchft, as torchft's train_ddp example does it.

Each replica group is one process (``REPLICA_GROUP_ID`` of ``NUM_REPLICA_GROUPS``), started by its own
``torchrun --nproc-per-node 1`` beside a ``torchft_lighthouse``; the model is wrapped in torchft's
``DistributedDataParallel`` and the optimizer in its ``Optimizer``, so a group that fails drops out of the
quorum and the others go on; a restarted group takes the live state from a peer (``state_dict`` /
``load_state_dict`` hooks), not from storage. The step counter is the manager's. The step log has the same
lines as plain_ddp.py's, with the replica group as ``rank``.
"""

import argparse
import json
import os
import signal
import time
from datetime import timedelta

import torch
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--crash-rank", type=int, default=-1, help="this replica group kills itself in its first launch")
    p.add_argument("--crash-step", type=int, default=0)
    p.add_argument("--step-log", default="")
    p.add_argument("--timeout", type=float, default=5.0, help="torchft's collective and quorum timeout, seconds")
    args = p.parse_args()
    group = int(os.environ.get("REPLICA_GROUP_ID", "0"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 1))
    inner = torch.optim.AdamW(m.parameters(), lr=1e-2)

    def load_state_dict(state: dict) -> None:
        m.load_state_dict(state["model"])
        inner.load_state_dict(state["opt"])

    def state_dict() -> dict:
        return {"model": m.state_dict(), "opt": inner.state_dict()}

    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=args.timeout)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict, replica_id=f"plain_ddp_{group}",
                      timeout=timedelta(seconds=args.timeout))
    model = DistributedDataParallel(manager, m)
    opt = Optimizer(manager, inner)
    gen = torch.Generator().manual_seed(1234 + group)
    while manager.current_step() < args.steps:
        x = torch.randn(64, 16, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()  # starts the quorum
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()  # commits only if every member's allreduce succeeded
        time.sleep(args.step_seconds)
        step = manager.current_step()
        if args.step_log:
            with open(f"{args.step_log}.{group}", "a") as log:
                log.write(json.dumps({"restart": restart, "rank": group, "step": step, "time": time.time(),
                                      "participants": manager.num_participants()}) + "\n")
        if group == args.crash_rank and restart == 0 and step >= args.crash_step:  # it may heal past the step
            os.kill(os.getpid(), signal.SIGKILL)
        if step % 10 == 0:
            print(f"group {group} step {step} loss {loss.item():.4f}", flush=True)
    print(f"group {group}: done", flush=True)


if __name__ == "__main__":
    main()
