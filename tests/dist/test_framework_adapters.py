"""The framework adapters in one process: a Hugging Face and a Lightning Trainer report their own global steps,
resume points, saves and loads, and the optimizer hooks beside them count nothing twice."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from trainguard.core.protocol import RunLayout, WorkerEnv, read_heartbeat
from trainguard.worker import autohooks, bootstrap, frameworks, runtime

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def rt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[runtime.Runtime]:
    for key in ("RANK", "TRAINGUARD_AGENT_PID", "TRAINGUARD_CHAOS", frameworks.ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TRAINGUARD_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("TRAINGUARD_HEARTBEAT_DIR", str(tmp_path / "hb"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    r = runtime.acquire(env=WorkerEnv.from_environ())
    assert autohooks.install_optimizer_hooks(torch.optim)
    yield r
    autohooks.uninstall()
    r.close()


def _records(rt: runtime.Runtime) -> list[dict[str, Any]]:
    path = RunLayout(rt.run_dir).rank_events(0)
    return [json.loads(line) for line in path.read_text().splitlines()]


def _of(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == kind]


def test_the_finder_watches_the_frameworks_unless_told_not_to() -> None:
    assert set(bootstrap.FRAMEWORK_MODULES) == set(frameworks.MODULES)
    assert bootstrap.FRAMEWORKS_ENV == frameworks.ENV
    assert bootstrap.watched({}) == bootstrap.WATCHED + bootstrap.FRAMEWORK_MODULES + bootstrap.CHECKPOINT_MODULES
    assert bootstrap.watched({frameworks.ENV: "0"}) == bootstrap.WATCHED + bootstrap.CHECKPOINT_MODULES
    assert not frameworks.enabled({frameworks.ENV: "0"}) and frameworks.enabled({})


def _hf_trainer(tmp_path: Path, **args: Any) -> Any:
    import transformers.trainer
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    assert frameworks.on_import("transformers.trainer", transformers.trainer)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16))
    ids = torch.randint(0, 64, (32, 16))
    data = [{"input_ids": row, "labels": row} for row in ids]
    training = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none",
                                 per_device_train_batch_size=2, disable_tqdm=True, save_strategy="steps", **args)
    return Trainer(model=model, args=training, train_dataset=data)


def test_a_hf_trainer_reports_its_global_steps_losses_saves_and_resume(rt: runtime.Runtime, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from trainguard.worker.frameworks import hf

    trainer = _hf_trainer(tmp_path, max_steps=6, save_steps=3, logging_steps=2, optim="sgd")
    assert hf.callback_of(trainer) is not None
    trainer.train()
    records = _records(rt)
    steps = _of(records, "step_completed")
    # One record per optimizer step although the optimizer hooks are installed too: the adapter owns the clock.
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert {s["numbering"] for s in steps} == {"framework"}
    assert [s["step"] for s in steps if s["loss"] is not None] == [2, 4, 6]
    assert all(0 < s["epoch"] <= 1 for s in steps)
    saves = _of(records, "checkpoint_save_finished")
    assert [(s["step"], s["framework"], s["ok"]) for s in saves] == [(3, "transformers", True), (6, "transformers", True)]
    assert saves[0]["path"].endswith("checkpoint-3") and saves[0]["bytes"] > 0 and saves[0]["blocking_seconds"] > 0
    assert [s["step"] for s in _of(records, "checkpoint_save_started")] == [3, 6]
    assert _of(records, "checkpoint_loaded") == []  # trained from scratch: no resume point
    assert rt.step_owner is None  # training is over: the optimizer hooks count again

    # A new Trainer resumes from checkpoint-3: its resume point and load time, then steps 4-6 by global step.
    again = _hf_trainer(tmp_path, max_steps=6, save_steps=3, logging_steps=2, optim="sgd")
    again.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-3"))
    records = _records(rt)[len(records):]
    (loaded,) = _of(records, "checkpoint_loaded")
    assert (loaded["step"], loaded["framework"]) == (3, "transformers") and loaded["seconds"] > 0
    assert loaded["path"].endswith("checkpoint-3")
    assert [s["step"] for s in _of(records, "step_completed")] == [4, 5, 6]
    beat = read_heartbeat(tmp_path / "hb" / "rank-0")
    assert beat is not None and beat.source == "optimizer" and beat.step == 6


def test_without_the_adapter_the_optimizer_hooks_count_as_before(rt: runtime.Runtime, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from trainguard.worker.frameworks import hf

    trainer = _hf_trainer(tmp_path, max_steps=3, save_steps=10, logging_steps=10, optim="sgd")
    callback = hf.callback_of(trainer)
    assert callback is not None
    trainer.remove_callback(callback)
    trainer.train()
    steps = _of(_records(rt), "step_completed")
    assert [(s["step"], s["numbering"]) for s in steps] == [(1, "attempt"), (2, "attempt"), (3, "attempt")]


def _lightning_trainer(tmp_path: Path, max_steps: int) -> Any:
    import lightning as L
    import lightning.pytorch.trainer.trainer as module

    assert frameworks.on_import("lightning.pytorch.trainer.trainer", module)
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), filename="{step}",
                                               every_n_train_steps=3, save_top_k=-1, save_last=True)
    return L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, callbacks=[ckpt], logger=False,
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


class _Module:
    @staticmethod
    def build() -> Any:
        import lightning as L

        class Regressor(L.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.net = torch.nn.Linear(4, 1)

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                x, y = batch
                return torch.nn.functional.mse_loss(self.net(x), y)

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.AdamW(self.parameters(), lr=1e-2)

        return Regressor()


def test_a_lightning_trainer_reports_its_global_steps_saves_and_resume(rt: runtime.Runtime, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    from trainguard.worker.frameworks import lightning as adapter

    x = torch.randn(64, 4)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
    trainer = _lightning_trainer(tmp_path, 6)
    callback = adapter.callback_of(trainer)
    assert callback is not None and trainer.callbacks[0] is callback  # before ModelCheckpoint
    trainer.fit(_Module.build(), data)
    records = _records(rt)
    steps = _of(records, "step_completed")
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert {s["numbering"] for s in steps} == {"framework"} and all(s["loss"] is not None for s in steps)
    saves = _of(records, "checkpoint_save_finished")
    # Each checkpoint step writes step=N.ckpt and last.ckpt: two saves, both stalls.
    assert sorted({s["step"] for s in saves}) == [3, 6] and all(s["framework"] == "lightning" for s in saves)
    assert any(s["path"].endswith("step=3.ckpt") and s["bytes"] > 0 for s in saves)

    trainer = _lightning_trainer(tmp_path, 9)
    trainer.fit(_Module.build(), data, ckpt_path=str(tmp_path / "ckpt" / "step=3.ckpt"))
    records = _records(rt)[len(records):]
    (loaded,) = _of(records, "checkpoint_loaded")
    assert (loaded["step"], loaded["framework"]) == (3, "lightning") and loaded["path"].endswith("step=3.ckpt")
    assert [s["step"] for s in _of(records, "step_completed")] == [4, 5, 6, 7, 8, 9]


def test_a_lightning_callback_pickles_and_starts_empty(rt: runtime.Runtime) -> None:
    pytest.importorskip("lightning")
    from trainguard.worker.frameworks import lightning as adapter

    callback = adapter.callback_class("lightning.pytorch")()
    callback.reporter.train_begin(5)
    copy = pickle.loads(pickle.dumps(callback))
    assert type(copy) is type(callback) and copy.reporter.last_step is None and not copy.reporter.training
    callback.reporter.train_end()
