"""The ``restart-now`` straggler policy's link between node agents: count waiting spares, tell a node to leave.

The group-rank-0 agent names stragglers; the slow rank's node may be another agent. The decision travels
through the rendezvous store every node of the round shares (run directories need not be shared), and
the spares are counted from torch's c10d rendezvous state (`trainguard.torch_api.rendezvous`, imported when
first needed: this module imports no torch). Announcements are signed with the job's secret
(`trainguard.launch.store_auth`): the store accepts writes from any local user, and an unsigned one is
ignored with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Signer(Protocol):
    """Signs and checks store values with the job's secret (`trainguard.launch.store_auth.StoreSigner`)."""

    def sign(self, context: str, fields: dict[str, str]) -> bytes:
        ...

    def verify(self, context: str, raw: bytes, names: tuple[str, ...]) -> dict[str, str] | None:
        ...


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

    def __init__(self, store: Callable[[], Any], run_id: str, rdzv_handler: Any, signer: Signer) -> None:
        self._store = store
        """Returns the store of the current rendezvous round (it changes at every restart), or None."""
        self.run_id = run_id
        self.handler = rdzv_handler
        self.signer = signer
        """Signs announcements and checks the ones read back."""
        self._refused: set[tuple[str, bytes]] = set()

    def spares_waiting(self) -> int:
        from trainguard.torch_api.rendezvous import spares_waiting

        return spares_waiting(self.handler)

    def announce(self, attempt: int, node: str, reason: str) -> None:
        store = self._store()
        if store is None:
            raise RuntimeError("no rendezvous store yet")
        key = _key(self.run_id, attempt)
        store.set(key, self.signer.sign(key, {"node": node, "reason": reason}))

    def announced(self, attempt: int) -> tuple[str, str] | None:
        store = self._store()
        if store is None:
            return None
        key = _key(self.run_id, attempt)
        try:
            if not store.check([key]):
                return None
            raw = bytes(store.get(key))
        except Exception as exc:  # a store going away at the end of the job
            log.debug("straggler announcement unreadable: %s", exc)
            return None
        if (key, raw) in self._refused:  # said once: the poll comes back every second
            return None
        fields = self.signer.verify(key, raw, ("node", "reason"))
        if fields is None:
            self._refused.add((key, raw))
            return None
        return fields["node"], fields["reason"]
