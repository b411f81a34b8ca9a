"""Node-level faults an agent fires itself: ``node-crash`` and ``agent-kill`` when its ranks reach the step,
and the ``unhealthy`` flag its health check then fails on (the grammar and the in-rank faults: `faults`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from trainguard.chaos.faults import Fault
from trainguard.core.events import NODE_FAULT_RANK, Event, FaultInjected
from trainguard.core.protocol import RunLayout
from trainguard.core.safefs import create_exclusive, write_private

log = logging.getLogger(__name__)

NODE_FAULT_KINDS = ("node-crash", "agent-kill")


def apply_node_chaos(faults: Iterable[Fault], node: str, layout: RunLayout, attempt: int,
                     emit: Callable[[Event], None]) -> None:
    """Leave the marker that makes this node's health check fail, for an ``unhealthy`` fault of ``attempt``."""
    for f in faults:
        if f.kind != "unhealthy" or f.node != node:
            continue
        if (f.attempt if f.attempt is not None else 0) != attempt:
            continue
        marker = layout.unhealthy_flag(node)
        write_private(marker, f"{f.to_spec()}\n".encode())
        emit(FaultInjected(time=time.time(), host=node, attempt=attempt,
                           rank=NODE_FAULT_RANK, step=0, kind="unhealthy", params={"node": node}))


def due_node_faults(faults: Iterable[Fault], node: str, attempt: int, last_step: int | None) -> list[Fault]:
    """This node's ``node-crash``/``agent-kill`` faults due now: its ranks completed step ``S - 1``."""
    return [f for f in faults if f.kind in NODE_FAULT_KINDS and f.node == node and last_step is not None
            and (f.attempt is None or f.attempt == attempt) and last_step >= (f.step or 1) - 1]


def fire_due_faults(faults: Iterable[Fault], node: str, attempt: int, steps: list[int], worker_pids: list[int],
                    chaos_dir: Path, emit: Callable[[Event], None]) -> None:
    """Fire this node's node faults that are due, given its ranks' last completed steps (`due_node_faults`)."""
    for fault in due_node_faults(faults, node, attempt, min(steps, default=None)):
        record = FaultInjected(time=time.time(), host=node, attempt=attempt, rank=NODE_FAULT_RANK, step=fault.step or 0,
                               kind=fault.kind, params={"node": node})
        fire_node_fault(fault, chaos_dir, attempt, worker_pids, record, emit)


def fire_node_fault(fault: Fault, chaos_dir: Path, attempt: int, worker_pids: list[int], record: Event,
                    emit: Callable[[Event], None]) -> None:
    """Claim the fault's marker (it fires once per run), record it, then kill: the workers' process groups
    too for ``node-crash``, this agent alone for ``agent-kill``. Does not return when it fires."""
    marker = chaos_dir / f"fired-{fault.index}"
    try:
        if not create_exclusive(marker, f"{fault.to_spec()} attempt={attempt} agent={os.getpid()}\n".encode()):
            return
    except OSError as exc:
        log.warning("chaos: cannot write marker %s (%s); not firing", marker, exc)
        return
    log.warning("chaos: firing %s", fault.to_spec())
    emit(record)
    if fault.kind == "node-crash":
        for pid in worker_pids:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # the workers lead their own sessions (torch starts them so)
    os.kill(os.getpid(), signal.SIGKILL)
