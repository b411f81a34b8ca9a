"""`supervise`: run one node's agent to the end of the job and say how it ended."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from trainguard import errors
from trainguard.events import FailureDetected, RunEnded
from trainguard.launch.config import SupervisorConfig
from trainguard.rundir import RunDir
from trainguard.worker import parse_heartbeat

log = logging.getLogger(__name__)

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_EXCLUDED = errors.EXIT_EXCLUDED
"""This node was excluded by a health check or the lemon list; the job may go on elsewhere."""


@dataclass(frozen=True)
class SupervisorResult:
    """How one node's supervision ended."""

    exit_code: int
    status: str
    """``completed``, ``failed``, ``excluded`` or ``aborted``."""
    reason: str
    attempts: int
    completed_steps: int | None
    failures: list[FailureDetected] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _completed_steps(agent: Any) -> int | None:
    best = None
    for path in agent.hb_dir().glob("rank-*"):
        beat = parse_heartbeat(path.read_bytes())
        if beat is not None and (best is None or beat["step"] < best):
            best = beat["step"]
    return best


def supervise(cfg: SupervisorConfig) -> SupervisorResult:
    """Run the job's workers on this node until it completes, fails for good, or this node is excluded."""
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # gloo restarts need a fresh store per attempt
    from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from trainguard.launch.agent import GuardAgent

    RunDir(cfg.run_dir).create()
    params = RendezvousParameters(
        backend="c10d", endpoint=cfg.rdzv_endpoint, run_id=cfg.run_id,
        min_nodes=cfg.min_nodes, max_nodes=cfg.max_nodes,
        join_timeout=cfg.join_timeout_seconds, last_call_timeout=cfg.last_call_seconds, close_timeout=10,
    )
    handler = get_rendezvous_handler(params)
    command = list(cfg.command)
    if command[0].endswith(".py"):
        entry, args = sys.executable, ("-u", *command)
    else:
        entry, args = command[0], tuple(command[1:])
    spec = WorkerSpec(role="trainer", local_world_size=cfg.nproc_per_node, entrypoint=entry, args=args,
                      rdzv_handler=handler, max_restarts=cfg.max_restarts,
                      monitor_interval=cfg.monitor_interval_seconds)
    agent = GuardAgent(spec, cfg)
    status, reason, code = "failed", "", EXIT_FAILED
    try:
        result = agent.run()
        if agent.excluded_reason is not None:
            status, reason, code = "excluded", f"node excluded: {agent.excluded_reason}", EXIT_EXCLUDED
        elif result is not None and result.state == WorkerState.SUCCEEDED:
            status, reason, code = "completed", "all workers finished", EXIT_COMPLETED
        else:
            reason = agent.stop_reason or f"restart budget spent ({cfg.max_restarts} restarts)"
    except SignalException as exc:
        status, reason, code = "aborted", f"stopped by signal {exc.sigval}", 130
    except Exception as exc:  # the rendezvous store vanished, a peer agent died, ...
        log.debug("agent failed", exc_info=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        status, reason = "failed", f"agent error: {exc.__class__.__name__}: {first[:300]}"
    finally:
        if status in ("completed", "failed"):
            try:
                handler.shutdown()
            except Exception as exc:
                log.debug("rendezvous shutdown: %s", exc)
    steps = _completed_steps(agent) if agent.attempt >= 0 else None
    if agent.leader and status != "excluded":  # an excluded node no longer speaks for the job
        agent.emit(RunEnded(time=time.time(), host=cfg.node_id, run_id=cfg.run_id, status=status,
                            reason=reason, exit_code=code, completed_steps=steps))
    agent.events.close()
    return SupervisorResult(code, status, reason, agent.attempt + 1, steps, list(agent.failures))
