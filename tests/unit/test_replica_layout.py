"""`trainguard.Replica`'s wire format: a state dict becomes a JSON layout plus tensors and comes back the same; a
layout from a peer that is malformed or names something other than a dtype is refused (no pickle, no code)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from trainguard.worker.replica import Replica, _layout, _rebuild


def _adamw_state() -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.9))
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "by_index": {0: torch.arange(3), 7: None}, "flag": True}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_a_state_dict_crosses_as_json_and_tensors_and_comes_back_the_same() -> None:
    state = _adamw_state()
    sent: list[torch.Tensor] = []
    wire = json.dumps(_layout(state, sent))  # what the source broadcasts, besides the tensors
    received: list[torch.Tensor] = []
    rebuilt = _rebuild(json.loads(wire), received)
    assert len(received) == len(sent) > 4
    for into, source in zip(received, sent, strict=True):
        into.copy_(source)  # what the tensor broadcasts do
    assert _same(state, rebuilt)
    assert isinstance(rebuilt["optim"]["param_groups"][0]["betas"], tuple)
    assert list(rebuilt["by_index"]) == [0, 7]


@pytest.mark.parametrize("layout", [
    {"tensor": 1},
    {},
    {"__tensor__": 0, "dtype": "nn", "shape": [1]},
    {"__tensor__": 0, "dtype": "load", "shape": [1]},
    {"__tensor__": 5, "dtype": "float32", "shape": [1]},
    [1, 2],
])
def test_a_malformed_layout_from_a_peer_is_refused(layout: Any) -> None:
    with pytest.raises(ValueError, match=r"Replica\.heal"):
        _rebuild(layout, [])


def test_a_value_that_is_not_plain_data_is_not_sent() -> None:
    with pytest.raises(TypeError, match="cannot send a object"):
        _layout({"x": object()}, [])


def test_keep_builds_once_per_process() -> None:
    replica: Replica[list[int]] = Replica()
    first = replica.keep(lambda: [1])
    assert replica.keep(lambda: [2]) is first and replica.step is None
    replica.completed(5)
    assert replica.step == 5
