"""The automatic optimizer hooks in one process: what a step is, its number, attach() winning, and their cost."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainguard.core.protocol import RunLayout, WorkerEnv, read_heartbeat
from trainguard.worker import autohooks, runtime
from trainguard.worker.library import attach


@pytest.fixture
def rt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[runtime.Runtime]:
    for key in ("RANK", "TRAINGUARD_AGENT_PID", "TRAINGUARD_CHAOS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TRAINGUARD_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("TRAINGUARD_HEARTBEAT_DIR", str(tmp_path / "hb"))
    r = runtime.acquire(env=WorkerEnv.from_environ())
    assert autohooks.install_optimizer_hooks(torch.optim)
    yield r
    autohooks.uninstall()
    r.close()


def _steps(run_dir: Path) -> list[int]:
    path = RunLayout(run_dir).rank_events(0)
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if '"step_completed"' in x]


def _train(opt: torch.optim.Optimizer, n: int, *others: torch.optim.Optimizer) -> None:
    for _ in range(n):
        for o in (opt, *others):
            for group in o.param_groups:
                for p in group["params"]:
                    p.grad = torch.ones_like(p)
            o.step()


def test_a_step_is_one_update_of_the_first_optimizer_numbered_by_its_own_count(rt: runtime.Runtime,
                                                                               tmp_path: Path) -> None:
    w1, w2 = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    adam = torch.optim.Adam([w1])
    _train(adam, 2, torch.optim.SGD([w2], lr=0.1))  # a second optimizer stepping alongside does not count
    assert _steps(rt.run_dir) == [1, 2]
    beat = read_heartbeat(tmp_path / "hb" / "rank-0")
    assert beat is not None and beat.source == "optimizer" and beat.step == 2 and beat.steps_done == 2

    # A "resumed" optimizer: its restored state says 10 steps were done, so the next is step 11.
    state = adam.state_dict()
    state["state"][0]["step"] = torch.tensor(10.0)
    resumed = torch.optim.Adam([w1])
    resumed.load_state_dict(state)
    del adam  # the lead is gone: the next optimizer to step leads
    _train(resumed, 1)
    assert _steps(rt.run_dir) == [1, 2, 11]


def test_without_step_state_the_attempt_counts(rt: runtime.Runtime) -> None:
    _train(torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1), 3)
    assert _steps(rt.run_dir) == [1, 2, 3]


def test_the_script_steps_win_from_its_first_worker_step(rt: runtime.Runtime) -> None:
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    _train(opt, 1)
    w = attach()
    # Still counted: a script that attaches (for a Checkpointer, a Replica) but never calls worker.step kept no
    # progress signal at all, so its hangs went unseen (the live-heal copy of docs/peers.md).
    _train(opt, 2)
    assert rt.source == "optimizer"
    with w.step(7):
        _train(opt, 1)  # inside the script's step: the script counts it
    _train(opt, 2)  # no longer counted
    assert _steps(rt.run_dir) == [1, 2, 3, 7] and rt.source == "script"


def test_per_step_cost_of_the_hooks(rt: runtime.Runtime) -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    opt.param_groups[0]["params"][0].grad = torch.ones(1)

    def median_step(n: int = 2000) -> float:
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            opt.step()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    with_hooks = median_step()
    autohooks.uninstall()
    without = median_step()
    cost = with_hooks - without
    print(f"optimizer step median: {without * 1e6:.1f} us bare, {with_hooks * 1e6:.1f} us hooked, "
          f"hook cost {cost * 1e6:.1f} us")
    assert cost < 500e-6  # generous: 2 shared cores; typically ~20-40 us (heartbeat pwrite + event line)
