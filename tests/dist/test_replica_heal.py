"""`trainguard.Replica.heal` on a real 3-process gloo group: ranks at different steps (a survivor behind another,
a new rank with no optimizer state at all) all end with the state of the lowest rank holding the newest step."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

RANK = textwrap.dedent("""
    import datetime, sys
    import torch, torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from trainguard.worker.replica import Replica

    rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    steps = {0: 5, 1: 6, 2: None}[rank]          # rank 2 is a new process: nothing trained yet
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=3,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(rank)                       # every rank's state differs before the heal
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    replica = Replica()
    for step in range(1, (steps or 0) + 1):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        replica.completed(step)
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, out + ".before")
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    got = replica.heal(state)
    if replica.last is not None and replica.last.received:
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    h = replica.last
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "got": got, "source": h.source,
                "received": h.received, "bytes": h.tensor_bytes, "step": replica.step}, out)
    dist.destroy_process_group()
""")


@pytest.mark.timeout(180)
def test_every_rank_ends_with_the_newest_live_state_of_the_lowest_rank_holding_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(tmp_path / "store"), str(tmp_path / f"r{r}")],
                              env=env, stderr=subprocess.PIPE, text=True) for r in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=150)
        assert p.returncode == 0, err[-3000:]
    after = [torch.load(tmp_path / f"r{r}", weights_only=True) for r in range(3)]
    source = torch.load(tmp_path / "r1.before", weights_only=True)
    assert [(a["got"], a["source"], a["received"], a["step"]) for a in after] == [
        (6, 1, True, 6), (6, 1, False, 6), (6, 1, True, 6)]
    assert after[0]["bytes"] == after[1]["bytes"] > 0
    for a in after:
        for name, t in source["model"].items():
            assert torch.equal(a["model"][name], t), name
        assert set(a["optim"]["state"]) == set(source["optim"]["state"]) == {0, 1, 2, 3}
        for index, entry in source["optim"]["state"].items():
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(a["optim"]["state"][index][key], entry[key]), (index, key)
