"""Causal language modelling with the Hugging Face ``Trainer``, in the shape of transformers'
``examples/pytorch/language-modeling/run_clm.py`` (GPT-2 from a config, a local text file, grouped blocks,
resume from the last checkpoint in ``--output_dir``). It has never heard of trainguard and needs no network:
the model is built from a tiny config and the text is turned into ids byte by byte (no tokenizer download).

    torchrun --nproc-per-node 2 hf_clm.py --train_file data.txt --output_dir out --do_train --max_steps 30 \
        --save_steps 10 --use_cpu --ddp_backend gloo --report_to none
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    n_layer: int = field(default=2, metadata={"help": "Transformer layers."})
    n_embd: int = field(default=32, metadata={"help": "Hidden size."})
    n_head: int = field(default=2, metadata={"help": "Attention heads."})
    vocab_size: int = field(default=128, metadata={"help": "Vocabulary (ids are bytes modulo this)."})


@dataclass
class DataTrainingArguments:
    train_file: str = field(default="", metadata={"help": "A local text file."})
    block_size: int = field(default=32, metadata={"help": "Tokens per training example."})
    batch_delay: float = field(default=0.0, metadata={"help": "Seconds each batch takes to arrive (slow storage)."})
    timing_log: str = field(default="", metadata={"help": "Append when the first step ended (wall clock) here."})


class Blocks(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """run_clm's group_texts: the whole text as ids, cut into blocks; the labels are the inputs."""

    def __init__(self, ids: list[int], block_size: int) -> None:
        total = (len(ids) // block_size) * block_size
        self.blocks = torch.tensor(ids[:total], dtype=torch.long).view(-1, block_size)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


class FirstStepTimer(transformers.TrainerCallback):
    """Writes when the first optimizer step of this process ended, for comparing launchers."""

    def __init__(self, path: str, rank: int) -> None:
        self.path, self.rank, self.done = path, rank, False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.done:
            self.done = True
            with open(f"{self.path}.{self.rank}", "a") as fh:
                fh.write(json.dumps({"what": "first_step", "step": state.global_step, "end": time.time()}) + "\n")


def make_collator(delay: float) -> Any:
    def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if delay:
            time.sleep(delay)
        return {k: torch.stack([item[k] for item in items]) for k in items[0]}

    return collate


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    if training_args.should_log:
        transformers.utils.logging.set_verbosity_info()

    last_checkpoint = None
    overwrite = getattr(training_args, "overwrite_output_dir", False)
    if os.path.isdir(training_args.output_dir) and training_args.do_train and not overwrite:
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
        if last_checkpoint is not None:
            logger.info(f"Checkpoint detected, resuming training at {last_checkpoint}.")

    torch.manual_seed(training_args.seed)
    config = GPT2Config(n_layer=model_args.n_layer, n_embd=model_args.n_embd, n_head=model_args.n_head,
                        vocab_size=model_args.vocab_size, n_positions=data_args.block_size)
    model = GPT2LMHeadModel(config)
    with open(data_args.train_file, "rb") as f:
        ids = [b % model_args.vocab_size for b in f.read()]
    train_dataset = Blocks(ids, data_args.block_size)

    callbacks = [FirstStepTimer(data_args.timing_log, training_args.process_index)] if data_args.timing_log else []
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset,
                      data_collator=make_collator(data_args.batch_delay), callbacks=callbacks)
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=last_checkpoint)
        trainer.log_metrics("train", result.metrics)
        print(f"rank {training_args.process_index}: done at global step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
