"""The reference workload: a small GPT trained data-parallel (gloo on CPU, NCCL on GPUs), watched by trainguard.

Deterministic by construction: the model is initialized from ``--seed`` on every rank, the batch of
(step, rank) is generated from a seed derived from both, and a restart restores the model, the
optimizer and the RNG state of the last checkpoint, so a run with restarts ends with the same loss
as one without. Run it under ``trainguard run``, plain torchrun, or ``--no-trainguard`` for a baseline,
as a module of the installed package: ``trainguard run --nproc-per-node 2 -m trainguard.examples.train_gpt``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        for b in self.blocks:
            x = b(x, self.mask[: idx.shape[1], : idx.shape[1]])
        return self.head(self.ln(x))


def batch_for(step: int, rank: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic synthetic data: a noisy repeating pattern, a function of (seed, step, rank) only."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    start = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    stride = torch.randint(1, 7, (args.batch, 1), generator=g)
    seq = (start + stride * torch.arange(args.seq + 1)) % args.vocab
    noise = torch.rand(seq.shape, generator=g) < 0.1
    seq = torch.where(noise, torch.randint(0, args.vocab, seq.shape, generator=g), seq)
    return seq[:, :-1], seq[:, 1:]


class _NullStep:
    loss: float | None = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield


class _NullWorker:
    """Stands in for trainguard's Worker in the ``--no-trainguard`` baseline."""

    events = None

    def __init__(self) -> None:
        # read when the baseline starts, not at import: a warm spare loads this module before it has a rank
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[_NullStep]:
        yield _NullStep()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield

    def close(self) -> None:
        pass


def make_checkpointer(args: argparse.Namespace, worker: Any) -> Any:
    import trainguard

    config = trainguard.CheckpointConfig(directory=args.ckpt_dir,
                                         interval=trainguard.IntervalPolicy.every_steps(args.ckpt_every))
    if isinstance(worker, trainguard.Worker):  # events, attempt and the checkpoint phase come from the worker
        return trainguard.Checkpointer(worker, config)
    return trainguard.Checkpointer(args.ckpt_dir, config, attempt=worker.attempt)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--ckpt-dir", default=None, help="default: <run dir>/checkpoints")
    p.add_argument("--no-trainguard", action="store_true", help="baseline without the in-rank library")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--timing-out", default=None, help="rank 0 writes its own step times (JSON) here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS on GPUs
    torch.use_deterministic_algorithms(True)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    from trainguard.worker import pg_timeout

    dist.init_process_group("nccl" if cuda else "gloo", timeout=pg_timeout())
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.no_trainguard:
        worker: Any = _NullWorker()
        run_dir = os.environ.get("TRAINGUARD_RUN_DIR", "trainguard-runs/baseline")
    else:
        import trainguard

        worker = trainguard.attach()
        run_dir = str(worker.run_dir)
    args.ckpt_dir = args.ckpt_dir or os.path.join(run_dir, "checkpoints")

    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.d_model, args.layers, args.heads, args.seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    params = [p for p in model.parameters() if p.requires_grad]
    if rank == 0 and os.environ.get("TRAINGUARD_ATTEMPT", "0") == "0":
        n = sum(p.numel() for p in params)
        print(f"train_gpt: {n / 1e6:.2f}M parameters, world size {world}", flush=True)

    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    ckpt = make_checkpointer(args, worker)
    start_step = 0
    with worker.phase("checkpoint"):
        msd, osd = get_state_dict(model, opt)
        state: dict[str, Any] = {"model": msd, "optim": osd, "rng": torch.get_rng_state()}
        restored = ckpt.restore(state)
        if restored is not None:
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            torch.set_rng_state(state["rng"])
            start_step = restored
            if rank == 0:
                print(f"train_gpt: resumed from the checkpoint of step {restored}", flush=True)

    loss_value = float("nan")
    step_seconds: list[float] = []
    step_cpu_seconds: list[float] = []
    for step in range(start_step + 1, args.steps + 1):
        t_step, c_step = time.perf_counter(), time.process_time()
        with worker.step(step) as s:
            with s.phase("data"):
                x, y = batch_for(step, rank, args)
                x, y = x.to(device), y.to(device)
            with s.phase("forward_backward"):
                opt.zero_grad(set_to_none=False)
                logits = model(x)
                loss = F.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1))
                loss.backward()
            with s.phase("comm_wait"):
                flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
                dist.all_reduce(flat)
                flat /= world
                offset = 0
                for p in params:
                    p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
                loss_value = float(flat[-1])
            with s.phase("optimizer"):
                opt.step()
            s.loss = loss_value
            if ckpt.should_save(step) and step < args.steps:
                with s.phase("checkpoint"):
                    msd, osd = get_state_dict(model, opt)
                    ckpt.save(step, {"model": msd, "optim": osd, "rng": torch.get_rng_state()})
        step_seconds.append(time.perf_counter() - t_step)
        step_cpu_seconds.append(time.process_time() - c_step)
        if rank == 0 and (step % 10 == 0 or step == args.steps):
            print(f"train_gpt: step {step}/{args.steps} loss {loss_value:.6f}", flush=True)
    with worker.phase("checkpoint"):  # a pending async save may still be writing
        ckpt.wait()
        ckpt.close()
    if rank == 0:
        print(f"train_gpt: done, final loss {loss_value:.9f}", flush=True)
        if args.timing_out:
            with open(args.timing_out, "w") as fh:
                json.dump({"step_seconds": step_seconds, "step_cpu_seconds": step_cpu_seconds,
                           "final_loss": loss_value}, fh)
    worker.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0 if math.isfinite(loss_value) or args.steps <= start_step else 1


if __name__ == "__main__":
    sys.exit(main())
