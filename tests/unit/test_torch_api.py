"""Every private torch API trainguard wraps still works on the installed torch (fails when torch moves one).

These run on real torch objects: a one-rank gloo group for the flight recorder, a c10d rendezvous handler on
a loopback store, DCP's own flattening next to the fallback. CI runs them on both torch versions it installs.
"""

from __future__ import annotations

import socket
import tomllib
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from packaging.requirements import Requirement
from packaging.version import Version

from trainguard.localize.reader import decode_dump
from trainguard.torch_api import SUPPORTED, c10d, dcp, elastic, rendezvous
from trainguard.torch_api.features import probe

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_declares_the_supported_range() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_req = next(Requirement(d) for d in deps if Requirement(d).name == "torch")
    assert str(torch_req.specifier) == str(Requirement(f"torch{SUPPORTED}").specifier)
    for ok in ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0", "2.15.3"):
        assert Version(ok) in torch_req.specifier, ok
    for no in ("2.10.2", "2.16.0"):
        assert Version(no) not in torch_req.specifier, no


def test_every_feature_is_there_on_this_torch() -> None:
    support = probe()
    assert support.in_range, support.version
    assert support.missing() == [], support.summary_lines()
    assert support.summary_lines() == []
    assert support.to_json()["features"] == {f.name: True for f in support.features}


def test_agent_hooks_are_where_the_adapter_expects_them() -> None:
    assert elastic.missing_hooks() == []


@pytest.fixture
def one_rank_gloo():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_flight_recorder_dumps_decode(one_rank_gloo: None) -> None:
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    pickled = c10d.dump_flight_recorder("pickle", backend=dist.get_backend())
    as_json = c10d.dump_flight_recorder("json", backend=dist.get_backend())
    assert pickled is not None and as_json is not None
    for raw in (pickled, as_json):
        dump = decode_dump(raw, 0, Path("dump"))
        assert len([e for e in dump.entries if "all_reduce" in str(e.get("profiling_name"))]) >= 3


def test_nccl_asks_for_the_nccl_recorder_or_a_backend_aware_one() -> None:
    fn, extra = c10d.dump_function("pickle", "nccl")
    assert fn is not None
    assert extra == {"backend": "nccl"} or extra == {}
    if extra == {} and c10d.takes_backend(fn):
        pytest.fail("a backend-aware dump function must be given the backend")


def test_abort_is_available_and_ends_the_group() -> None:
    assert c10d.has_abort()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert c10d.abort_process_group() == "abort"
    assert not dist.is_initialized()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_rendezvous_spares_and_leave_on_a_real_c10d_handler() -> None:
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    port = _free_port()
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="torch-api-test",
                                  min_nodes=1, max_nodes=2, is_host="true", last_call_timeout=1, join_timeout=30)
    handler = get_rendezvous_handler(params)
    try:
        assert rendezvous.can_count_spares(handler) and rendezvous.can_leave(handler)
        handler.next_rendezvous()
        assert rendezvous.spares_waiting(handler) == 0
        assert rendezvous.leave(handler) is True
    finally:
        handler.shutdown()


def test_static_handler_has_no_spares() -> None:
    class Static:
        pass

    assert rendezvous.spares_waiting(Static()) == 0
    assert not rendezvous.can_count_spares(Static())


def test_flatten_matches_dcp_and_the_fallback_agrees() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 7, "rng": [1, 2, 3],
             "nested": {"lists": [torch.zeros(2), {"x": torch.ones(1)}]}}
    assert dcp.has_private_flatten()
    flat, mapping = dcp.flatten_state_dict(state)
    own_flat, own_mapping = dcp.own_flatten(state)
    assert list(own_flat) == list(flat)
    assert {k: tuple(v) for k, v in own_mapping.items()} == {k: tuple(v) for k, v in mapping.items()}
    for k in flat:
        assert own_flat[k] is flat[k]


def test_prewarm_modules_import() -> None:
    import importlib

    for name in c10d.PREWARM_MODULES:
        importlib.import_module(name)


class _FakeC10d:
    """Dump functions as torch's pybind builds them, told apart by their signature line."""

    def __init__(self, backend_aware: bool, nccl: bool) -> None:
        sig = ", backend: str = 'gloo'" if backend_aware else ""

        def generic(**kw: object) -> bytes:
            return b"generic"

        generic.__doc__ = f"_dump_fr_trace(includeCollectives: bool | None = None{sig}) -> bytes\n"
        self._dump_fr_trace = generic
        if nccl:
            self._dump_nccl_trace = lambda **kw: b"nccl"


def test_a_device_map_backend_counts_as_nccl_and_2_15_gets_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c10d, "_c10d_module", lambda: _FakeC10d(backend_aware=False, nccl=True))
    fn, extra = c10d.dump_function("pickle", "cpu:gloo,cuda:nccl")
    assert fn is not None and fn() == b"nccl" and extra == {}
    monkeypatch.setattr(c10d, "_c10d_module", lambda: _FakeC10d(backend_aware=True, nccl=True))
    fn, extra = c10d.dump_function("pickle", "cpu:gloo,cuda:nccl")
    assert fn is not None and fn() == b"generic" and extra == {"backend": "nccl"}
    fn, extra = c10d.dump_function("pickle", "gloo")
    assert extra == {"backend": "gloo"}


def test_the_range_check_works_without_packaging(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from trainguard.torch_api import features

    real_import = builtins.__import__

    def no_packaging(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("packaging"):
            raise ImportError("No module named 'packaging'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_packaging)
    assert features._in_range("2.11.0+cu130") and features._in_range("2.15.2")
    assert not features._in_range("2.10.1") and not features._in_range("2.16.0")
