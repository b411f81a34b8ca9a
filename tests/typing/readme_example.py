"""The README's in-script example, completed into a script: type-checked with ``mypy --strict``.

tests/unit/test_public_api.py runs mypy on it (it is not run as a test itself). It uses only top-level
names of ``trainguard``; the ``assert_type`` lines fail under mypy if a name were seen as ``Any``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, assert_type

import torch
import torch.distributed as dist

import trainguard


def train(steps: int) -> None:
    dist.init_process_group("gloo", timeout=trainguard.pg_timeout())
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state: dict[str, Any] = {"model": model.state_dict(), "optim": opt.state_dict()}

    with trainguard.attach() as worker:
        config = trainguard.CheckpointConfig(interval=trainguard.IntervalPolicy.every_steps(50))
        with trainguard.Checkpointer(worker, config) as ckpt:
            start = ckpt.restore(state) or 0
            for step in range(start + 1, steps + 1):
                with worker.step(step) as s:
                    with s.phase("forward_backward"):
                        loss = model(torch.ones(2, 4)).sum()
                        loss.backward()
                    opt.step()
                    s.loss = float(loss)
                    if ckpt.should_save(step):
                        ckpt.save(step, state)

            assert_type(worker, trainguard.Worker)
            assert_type(ckpt, trainguard.Checkpointer)
            assert_type(config, trainguard.CheckpointConfig)
            assert_type(trainguard.pg_timeout(), timedelta)
            assert_type(ckpt.restore(state), int | None)
    dist.destroy_process_group()


if __name__ == "__main__":
    train(100)
