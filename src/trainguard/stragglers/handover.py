"""The ``restart-now`` straggler policy's link between node agents: count waiting spares, tell a node to leave.

The group-rank-0 agent names stragglers; the slow rank's node may be another agent. The decision travels
through the rendezvous store every node of the round shares (run directories need not be shared), and
the spares are counted from torch's c10d rendezvous state (`trainguard.torch_api.rendezvous`, imported
when first needed: this module imports no torch).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Handover(Protocol):
    """What `trainguard.stragglers.watch.AgentWatch` needs from its agent for ``restart-now``."""

    def spares_waiting(self) -> int:
        """Nodes waiting in the rendezvous to join the job (0 when unknown)."""
        ...

    def announce(self, attempt: int, node: str, reason: str) -> None:
        """Tell every agent that ``node`` leaves attempt ``attempt`` now, because of ``reason``."""
        ...

    def announced(self, attempt: int) -> tuple[str, str] | None:
        """``(node, reason)`` announced for ``attempt``, or None."""
        ...


def _key(run_id: str, attempt: int) -> str:
    return f"trainguard/{run_id}/straggler-leave/{attempt}"


class StoreHandover:
    """`Handover` over the agent's rendezvous store and its c10d rendezvous handler."""

    def __init__(self, store: Callable[[], Any], run_id: str, rdzv_handler: Any) -> None:
        self._store = store
        """Returns the store of the current rendezvous round (it changes at every restart), or None."""
        self.run_id = run_id
        self.handler = rdzv_handler

    def spares_waiting(self) -> int:
        from trainguard.torch_api.rendezvous import spares_waiting

        return spares_waiting(self.handler)

    def announce(self, attempt: int, node: str, reason: str) -> None:
        store = self._store()
        if store is None:
            raise RuntimeError("no rendezvous store yet")
        store.set(_key(self.run_id, attempt), json.dumps({"node": node, "reason": reason}))

    def announced(self, attempt: int) -> tuple[str, str] | None:
        store = self._store()
        if store is None:
            return None
        key = _key(self.run_id, attempt)
        try:
            if not store.check([key]):
                return None
            data = json.loads(bytes(store.get(key)).decode())
            node, reason = data["node"], data["reason"]
        except Exception as exc:  # a store going away at the end of the job, a malformed value
            log.debug("straggler announcement unreadable: %s", exc)
            return None
        if isinstance(node, str) and isinstance(reason, str):
            return node, reason
        return None
