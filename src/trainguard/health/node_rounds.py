"""The health results a node recorded about itself, as check rounds: what ``--return-node`` judges a node by
when it is not run on that node (``trainguard health --node N --record --run-dir D``, run on N, writes them)."""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Sequence
from pathlib import Path

from trainguard.core.eventlog import read_events
from trainguard.core.events import HealthCheckResult
from trainguard.core.rundir import RunDir
from trainguard.health.base import CheckResult
from trainguard.health.sched_base import NodeState

log = logging.getLogger(__name__)


def writer_name(node: str) -> str:
    """The event file (``events/<name>.jsonl``) ``trainguard health --record`` writes ``node``'s results to."""
    return "health-" + re.sub(r"[^A-Za-z0-9_.@-]", "_", node)


def on_this_host(node: str, hostname: str | None = None) -> bool:
    """Whether ``node`` names the host this runs on (its host name, full or short)."""
    name = socket.gethostname() if hostname is None else hostname
    return bool(node) and node in {name, name.split(".", 1)[0]}


def _rounds(results: Sequence[HealthCheckResult]) -> list[tuple[HealthCheckResult, ...]]:
    """Consecutive results split into rounds: one ``--record`` writes each check once, so a check name seen
    again starts the next round."""
    rounds: list[tuple[HealthCheckResult, ...]] = []
    current: list[HealthCheckResult] = []
    for r in results:
        if any(c.name == r.name for c in current):
            rounds.append(tuple(current))
            current = []
        current.append(r)
    if current:
        rounds.append(tuple(current))
    return rounds


def recorded_rounds(run_dir: Path, state: NodeState) -> list[tuple[CheckResult, ...]]:
    """The rounds ``state.node`` recorded in ``run_dir/events/health-<node>.jsonl`` since it was drained
    (``state.since``; every round when the scheduler gives no time), oldest first. Only the node's own file is
    read and only results naming the node: another host's results say nothing about this one."""
    path = RunDir(run_dir).event_file(writer_name(state.node))
    if not path.is_file():
        return []
    since = state.since or 0.0  # Slurm's whole seconds round down: a round just after the drain still counts
    mine = [e for e in read_events(path)
            if isinstance(e, HealthCheckResult) and e.host == state.node and e.time >= since]
    return [tuple(CheckResult(e.name, e.severity, e.ok, e.detail, e.skipped) for e in rnd) for rnd in _rounds(mine)]
