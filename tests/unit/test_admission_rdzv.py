"""Admission before a restart: an unreachable rendezvous endpoint ends the node as a lost rendezvous (every
survivor sees it when the store's host died), never as an exclusion or a drain (docs/decisions.md N8)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from trainguard.core.events import Event, HealthCheckResult, NodeExcluded
from trainguard.health import drain
from trainguard.health.drain import DrainSettings
from trainguard.launch import admission
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.store_link import RendezvousLostError


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cfg(tmp_path: Path, endpoint: str) -> SupervisorConfig:
    cfg = SupervisorConfig(command=("train.py",), run_dir=tmp_path / "run", run_id="r", node_id="n1",
                           rdzv_endpoint=endpoint, nproc_per_node=1, health_checks=True, gpu_checks=False,
                           drain=DrainSettings(scheduler="slurm"))
    cfg.layout.root.mkdir(parents=True, exist_ok=True)
    return cfg


def test_a_dead_rendezvous_host_is_a_lost_rendezvous_not_this_nodes_exclusion(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drained: list[object] = []
    monkeypatch.setattr(drain, "drain_verdicts", lambda *a, **k: drained.append(a))
    emitted: list[Event] = []
    cfg = _cfg(tmp_path, f"127.0.0.1:{_closed_port()}")
    with pytest.raises(RendezvousLostError, match=r"rendezvous endpoint 127\.0\.0\.1:\d+ before attempt 1"):
        admission.exclusion_reasons(cfg, 1, emitted.append)
    # The failed check is on record; nothing excluded or drained the node for it.
    checks = {e.name: e for e in emitted if isinstance(e, HealthCheckResult)}
    assert checks["rdzv_reachable"].ok is False
    assert not [e for e in emitted if isinstance(e, NodeExcluded)]
    assert drained == []


def test_a_reachable_endpoint_admits_the_node(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        emitted: list[Event] = []
        cfg = _cfg(tmp_path, f"127.0.0.1:{server.getsockname()[1]}")
        assert admission.exclusion_reasons(cfg, 1, emitted.append) == []
    assert [e.ok for e in emitted if isinstance(e, HealthCheckResult) and e.name == "rdzv_reachable"] == [True]
