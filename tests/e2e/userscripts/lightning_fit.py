"""A PyTorch Lightning job written for torchrun (CPU, gloo) that has never heard of trainguard.

``ModelCheckpoint`` keeps a checkpoint every ``--ckpt-every`` steps (``step=N.ckpt``) and ``last.ckpt``; the
job resumes with ``ckpt_path="last"``. ``--optimizer sgd`` uses plain SGD, which keeps no step count.
``--timing-log FILE`` appends when the first step of this process ended (wall clock) to ``FILE.<rank>``.

    torchrun --nproc-per-node 2 lightning_fit.py --steps 30 --ckpt-dir ckpt --ckpt-every 10
"""

from __future__ import annotations

import argparse
import json
import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, optimizer: str, step_seconds: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.optimizer = optimizer
        self.step_seconds = step_seconds

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        time.sleep(self.step_seconds)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=1e-3)
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class FirstStepTimer(L.Callback):
    """Appends when the first training step of this process ended (wall clock) to ``PATH.<rank>``."""

    def __init__(self, path: str) -> None:
        self.path, self.done = path, False

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if not self.done:
            self.done = True
            with open(f"{self.path}.{trainer.global_rank}", "a") as fh:
                fh.write(json.dumps({"what": "first_step", "step": trainer.global_step, "end": time.time()}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--timing-log", default="", help="append when the first step of this process ended here")
    args = p.parse_args()
    torch.manual_seed(0)
    x = torch.randn(4096, 16)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32)
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=args.ckpt_dir, filename="{step}",
                                               every_n_train_steps=args.ckpt_every, save_top_k=-1, save_last=True)
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", 1)), max_steps=args.steps,
                        callbacks=[ckpt, *([FirstStepTimer(args.timing_log)] if args.timing_log else [])],
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        log_every_n_steps=10, num_sanity_val_steps=0)
    trainer.fit(Regressor(args.optimizer, args.step_seconds), data, ckpt_path="last")
    print(f"rank {trainer.global_rank}: done at global step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
