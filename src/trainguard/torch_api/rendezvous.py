"""The c10d rendezvous handler's private parts: leaving a round now, counting the spares that wait, and reading the
round number that gives the job its attempt numbers (`trainguard.launch.numbering`).

torch has no public "leave" (``shutdown()`` closes the rendezvous for every node) and no public count of
spares: ``num_nodes_waiting()`` counts only the wait list, which a node enters when the job is below its
maximum size; a spare of a full job sits in the redundancy list. Both are read from
``DynamicRendezvousHandler``'s state holder and operation executor.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)


def can_leave(handler: Any) -> bool:
    """Whether ``handler`` is a dynamic (c10d/etcd) handler this torch lets trainguard leave early."""
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp  # noqa: F401
    except ImportError:
        return False
    return hasattr(handler, "_stop_heartbeats") and hasattr(handler, "_op_executor")


def leave(handler: Any, timeout_seconds: float = 10.0) -> bool:
    """Leave the current rendezvous round now, so the other nodes (and a waiting spare) form the next one at
    once instead of waiting for this node's keep-alive to expire (3 x 5 s in torch's c10d handler).

    Returns False, with a warning, when it could not (the peers then drop this node at the keep-alive)."""
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

        handler._stop_heartbeats()
        handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + timeout_seconds)
        return True
    except Exception as exc:
        log.warning("could not leave the rendezvous (%s); peers wait for its keep-alive to expire", exc)
        return False


def can_count_spares(handler: Any) -> bool:
    """Whether ``handler`` exposes the state that `spares_waiting` reads (the static backend has none)."""
    return hasattr(handler, "_state_holder") and hasattr(handler, "_heartbeat_lock")


def spares_waiting(handler: Any) -> int:
    """Nodes waiting to join the job: the redundancy list plus the wait list (0 when unknown)."""
    holder = getattr(handler, "_state_holder", None)
    lock = getattr(handler, "_heartbeat_lock", None)
    if holder is None or lock is None:  # the static backend: no spares possible
        return 0
    try:
        with lock:
            holder.sync()
            state = holder.state
            return len(getattr(state, "redundancy_list", ())) + len(getattr(state, "wait_list", ()))
    except Exception as exc:  # an unreachable store: count none, so the policy falls back
        log.warning("cannot count waiting spares: %s", exc)
        return 0


def sync_waiting(handler: Any) -> int:
    """Read the rendezvous state from its store now (a network round trip that raises when the store does not
    answer) and return the nodes in the wait list: what torch's ``num_nodes_waiting()`` returns."""
    holder = handler._state_holder
    with handler._heartbeat_lock:
        holder.sync()
        return len(holder.state.wait_list)


def store_of(handler: Any) -> Any | None:
    """The store the dynamic handler keeps its state in (its ``_store``), or None."""
    return getattr(handler, "_store", None)


_JOINED = "_trainguard_joined_round"
_WRAPPED = "_trainguard_remembers_round"


def remember_joined_rounds(handler: Any) -> bool:
    """Make `round_of` exact: remember the round at the moment ``handler`` joins it. torch's handler starts its
    keep-alive thread right after joining (``_start_heartbeats``), and that thread refreshes the state from the store:
    read later (after the agents' rank exchange, seconds on a loaded host), the state could already be of the next
    round, which a peer restarting for a late node had opened, and two nodes of one round numbered it apart (a 3-node
    demo at load 12). Wraps this handler's ``_start_heartbeats``; False where the handler has none."""
    original = getattr(handler, "_start_heartbeats", None)
    holder = getattr(handler, "_state_holder", None)
    if not callable(original) or holder is None or getattr(original, _WRAPPED, False):
        return False

    def start_heartbeats() -> Any:
        value = getattr(getattr(holder, "state", None), "round", None)
        setattr(handler, _JOINED, value if isinstance(value, int) else None)
        return original()

    setattr(start_heartbeats, _WRAPPED, True)
    handler._start_heartbeats = start_heartbeats
    return True


def round_of(handler: Any) -> int | None:
    """The rendezvous round this node has just joined (job-wide: every node of the round reads the same number from
    the store), or None for a handler without rounds (static, the etcd v1 handler). Exact once
    `remember_joined_rounds` wrapped the handler; else the state as last read."""
    joined = getattr(handler, _JOINED, None)
    if isinstance(joined, int):
        return joined
    holder = getattr(handler, "_state_holder", None)
    state = getattr(holder, "state", None)
    value = getattr(state, "round", None)
    return value if isinstance(value, int) else None


def first_round(handler: Any, run_id: str, joined: int, first_attempt: int,
                timeout_seconds: float = 60.0) -> tuple[int, int] | None:
    """The job's first round and the attempt number it has, agreed through the rendezvous store: the first node to
    ask records the round it joined (``joined``) and ``first_attempt`` (a job requeued into the same run dir goes on
    from the attempts already there), every later one (a spare joining a running job too) reads that. ``add``
    decides who is first (every store has it; the etcd store has no compare-and-set). None when the store cannot be
    used."""
    store = getattr(handler, "_store", None)
    if store is None:
        return None
    key = f"trainguard/{run_id}/first_round"
    try:
        if store.add(f"{key}/claims", 1) == 1:
            store.set(key, f"{joined} {first_attempt}")
            return joined, first_attempt
        # The claimer sets the key right after its add: wait for it, not forever.
        store.wait([key], timedelta(seconds=timeout_seconds))
        round_text, attempt_text = store.get(key).decode().split()
        return int(round_text), int(attempt_text)
    except Exception as exc:  # a store that answers nothing or garbage: the agent keeps its own count
        log.warning("cannot agree on the job's first rendezvous round (%s); counting attempts locally", exc)
        return None
