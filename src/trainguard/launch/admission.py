"""Whether this node may join the next attempt: the health checks (which fail on the ``unhealthy`` flag of
`trainguard.chaos.node_faults`), the fleet's lemon list and lost-node markers; a node that fails leaves the
rendezvous and the job.

Runs in `trainguard.launch.agent.GuardAgent._rendezvous`, before every (re)start.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError

from trainguard.core.eventlog import iter_events
from trainguard.core.events import AttemptEnded, Event, HealthCheckResult, NodeExcluded
from trainguard.core.protocol import RunLayout
from trainguard.errors import TrainguardError
from trainguard.health import drain
from trainguard.launch import nodes
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.store_link import RendezvousLostError

log = logging.getLogger(__name__)

RDZV_CHECK = "rdzv_reachable"
"""The health check whose failure ends the node as a lost rendezvous, not an exclusion."""


class NodeExcludedExit(RendezvousGracefulExitError):
    """This node failed a high-severity health check (or is a lemon) and leaves the job."""


def exclusion_reasons(cfg: SupervisorConfig, attempt: int, emit: Callable[[Event], None]) -> list[str]:
    """Why this node must not join ``attempt``: failed high-severity health checks (every result is recorded),
    a lemon flag, a lost-node marker. Empty: it may join."""
    from trainguard.health import HealthConfig, run_checks

    bad: list[str] = []
    if cfg.health_checks:
        results = run_checks(HealthConfig(
            node=cfg.node_id, run_dir=cfg.run_dir, checkpoint_dir=cfg.checkpoint_dir,
            # The store only exists once the first rendezvous ran: check it on restarts only.
            rdzv_endpoint=cfg.rdzv_endpoint if attempt > 0 else None,
            torch_checks=False, gpu_checks=cfg.gpu_checks,
        ))
        unreachable = ""
        for r in results:
            emit(HealthCheckResult(time=time.time(), host=cfg.node_id, name=r.name, severity=r.severity, ok=r.ok,
                                   detail=r.detail, skipped=r.skipped, attempt=attempt))
            if r.ok or r.skipped or r.severity != "high":
                continue
            if r.name == RDZV_CHECK:
                unreachable = r.detail or "unreachable"
            else:
                bad.append(f"{r.name}: {r.detail}" if r.detail else r.name)
        if unreachable:
            # Every surviving node sees this when the store's host died (c10d): it says nothing against this node,
            # which must neither be excluded nor drained for it (docs/decisions.md N8).
            raise RendezvousLostError(
                f"rendezvous endpoint {cfg.rdzv_endpoint} before attempt {attempt}: {unreachable}")
    lemon = lemon_reasons(cfg)
    drain.after_admission(cfg, attempt, bad, bool(lemon), emit)  # --drain-bad-nodes (`trainguard.health.drain`)
    bad.extend(lemon)
    bad.extend(nodes.lost_reasons(cfg.run_dir, cfg.node_id))
    return bad


def lemon_reasons(cfg: SupervisorConfig) -> list[str]:
    from trainguard.health.fleetdb import FleetDB, is_url, resolve
    from trainguard.health.lemon import flagged_hosts

    where = resolve(cfg.fleet_db)
    if isinstance(where, Path) and not where.exists():  # no fleet history yet; do not create a database
        return []
    try:  # a server is opened read-only: one trainguard has not written yet is "no history" too
        with FleetDB(where, read_only=is_url(where)) as db:
            flagged = flagged_hosts(db)
    except Exception as exc:  # a broken fleet database must not stop the job
        log.warning("lemon check skipped: %s", exc)
        return []
    return [f"lemon: {cfg.node_id} flagged by fleet history"] if cfg.node_id in flagged else []


def exclude(node: str, attempt: int, reason: str, rdzv_handler: Any, emit: Callable[[Event], None]) -> NoReturn:
    """Record ``NodeExcluded``, leave the rendezvous and raise `NodeExcludedExit`."""
    emit(NodeExcluded(time=time.time(), host=node, node=node, reason=reason, attempt=attempt))
    leave_rendezvous(rdzv_handler)
    raise NodeExcludedExit(f"node {node} excluded: {reason}")


def leave_rendezvous(handler: Any) -> None:
    """Leave the current rendezvous round now, so the other nodes (and a waiting spare) form the next one
    at once instead of waiting until this node's keep-alive expires (3 x 5 s in torch's c10d handler)."""
    from trainguard.torch_api import rendezvous

    rendezvous.leave(handler)  # warns itself when it cannot: the others then wait for the keep-alive


def attempts_ended(layout: RunLayout) -> int:
    """1 + the highest attempt any agent of this run dir closed (0 when none did): where a joining spare
    continues the job's attempt numbers."""
    top = -1
    for path in layout.events_dir.glob("agent-*.jsonl"):
        with contextlib.suppress(TrainguardError):  # an unreadable file tells nothing about attempts
            for _, record in iter_events(path):
                if isinstance(record, AttemptEnded):
                    top = max(top, record.attempt)
    return top + 1
