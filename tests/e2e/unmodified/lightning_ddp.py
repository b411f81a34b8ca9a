"""A PyTorch Lightning DDP script written for torchrun (CPU, gloo); it has never heard of trainguard.

Lightning checkpoints itself every --ckpt-every steps (``last.ckpt``) and resumes with ``ckpt_path="last"``.
"""

import argparse
import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, step_seconds: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.step_seconds = step_seconds

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        time.sleep(self.step_seconds)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.05)
    args = p.parse_args()
    torch.manual_seed(0)
    x = torch.randn(4096, 16)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32)
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.ckpt_every,
                                               save_last=True, save_top_k=0)
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", 1)), max_steps=args.steps, callbacks=[ckpt],
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        log_every_n_steps=10, num_sanity_val_steps=0)
    trainer.fit(Regressor(args.step_seconds), data, ckpt_path="last")
    print(f"rank {trainer.global_rank}: done at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
