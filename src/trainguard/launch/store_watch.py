"""The rendezvous store's size, watched from the agent: torch's TCPStore takes any key from any local user.

torch's store has no size limit and no public way to refuse a write, so trainguard can only notice: every
`INTERVAL_SECONDS` the monitor loop of an agent on the store's host counts the store's keys (``num_keys``,
one local round trip: never a wait on another node) and reads its own resident memory, and says once on
the console when either grew past what a job needs.
docs/security.md ("The rendezvous store").
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 5.0
KEYS_PER_RANK = 50
"""Keys a job writes per rank (process groups, barriers, trainguard's own), generously."""
MIN_KEY_LIMIT = 20_000
GROWTH_LIMIT_BYTES = 256 << 20
"""Growth of the agent's resident memory since its first look: the agent itself stays flat in a run."""


@dataclass(frozen=True)
class StoreSize:
    """One look: the store's key count and the agent's resident bytes."""

    keys: int
    rss_bytes: int


def resident_bytes() -> int:
    """This process's resident memory (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def on_this_host(store: Any) -> bool:
    """Whether ``store`` (a TCPStore, possibly under PrefixStores) is served from this machine: its address
    is one this machine can bind. Other stores (etcd's, a remote TCPStore) are not watched from here."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    host = getattr(store, "host", None)
    if not isinstance(host, str) or not hasattr(store, "num_keys"):
        return False
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM):
            with socket.socket(family, kind, proto) as probe:
                probe.bind((address[0], 0))
                return True
    except OSError:
        pass
    return False


class StoreWatch:
    """Counts the store's keys now and then; warns once when a limit is passed (see module doc)."""

    def __init__(self, store: Callable[[], Any], world_size: Callable[[], int],
                 interval: float = INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._world_size = world_size
        self._interval = interval
        self._clock = clock
        self._next = 0.0
        self._baseline: int | None = None
        self.warned = False
        self._unsupported = False
        self._checked: Any = None
        """The store last found on this host (the store object changes at every rendezvous round)."""

    def key_limit(self) -> int:
        return max(MIN_KEY_LIMIT, KEYS_PER_RANK * max(1, self._world_size()))

    def poll(self) -> StoreSize | None:
        """One look when the interval has passed (else None): cheap enough for every monitor round."""
        now = self._clock()
        if self.warned or self._unsupported or now < self._next:
            return None
        self._next = now + self._interval
        store = self._store()
        if store is None:
            return None
        if store is not self._checked:
            if not on_this_host(store):
                return None  # asked again next round: a new rendezvous may bring a store served here
            self._checked = store
        try:
            keys = int(store.num_keys())
        except (NotImplementedError, AttributeError, RuntimeError, ValueError):
            self._unsupported = True  # a store without a count (etcd's): nothing to watch
            return None
        size = StoreSize(keys, resident_bytes())
        if self._baseline is None:
            self._baseline = size.rss_bytes
        growth = size.rss_bytes - self._baseline
        if size.keys > self.key_limit() or growth > GROWTH_LIMIT_BYTES:
            self.warned = True
            # An error, not a warning: trainguard.launch shows only errors on a quiet console, and this one
            # must reach it (as store_auth's forged-value lines do).
            log.error(
                "the rendezvous store holds %d keys (a job needs up to %d) and this agent's memory grew by %d MB: "
                "another local user may be filling the store; torch's store cannot refuse writes "
                "(docs/security.md)", size.keys, self.key_limit(), growth >> 20)
        return size
