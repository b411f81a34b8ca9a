"""This node's link to the rendezvous store, watched off the monitor loop: a node cut off from the job knows it.

torch's agent reads the rendezvous state on its monitor thread every round (``num_nodes_waiting()``), and so do
trainguard's own polls (a straggler's hand-over). When this node's network is cut, each such read blocks for the
store's timeout (60 s) and fails, and the loop that should notice anything is stuck: the node's workers hang in
their collectives, and the agent never ends (found with a partitioned host, benchmarks/scale.py). Here one thread
reads the state every second; the monitor loop takes the count it last read (never blocking), skips its own
store reads while the link is quiet, and ends the run when the store has not answered for longer than the other
nodes wait before they let this one go: by then the job has re-formed without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from trainguard.launch.shared_waiting import SharedWaiting
from trainguard.torch_api.rendezvous import can_count_spares, round_of, store_of, sync_waiting

log = logging.getLogger(__name__)

PROBE_INTERVAL_SECONDS = 1.0
"""How often the thread reads the rendezvous state (torch's monitor loop read it every round, 0.1-1 s)."""


class RendezvousLostError(RuntimeError):
    """The rendezvous store has not answered this node for longer than the job waits for a lost node."""


class StoreLink:
    """Reads the rendezvous state on its own thread; answers ``num_nodes_waiting`` for torch's loop from the last
    read, and says how long the store has been silent."""

    def __init__(self, handler: Any, endpoint: str, lost_after_seconds: float,
                 interval_seconds: float = PROBE_INTERVAL_SECONDS) -> None:
        self.handler = handler
        self.endpoint = endpoint
        self.lost_after_seconds = lost_after_seconds
        """Silence after which this node counts itself cut off from the job."""
        self.interval = interval_seconds
        self._waiting = 0
        self._last_ok = time.monotonic()
        self._failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._readers: dict[str, Callable[[], Any]] = {}
        self._wake = threading.Event()
        self._probe = threading.Lock()
        """Held for each read: torch's state holder is not safe to sync from two threads, so a rendezvous
        round (`pause`) waits for a read in flight and none starts until `resume`."""
        self._paused = False
        self._error: Exception | None = None
        """The last read's failure, until a read succeeds: torch's loop gets it as its own read would have."""
        self._answered = threading.Condition()
        self._last_ok_sent = self._last_ok
        """When the last answered read was sent: `confirm` wants one sent after it was asked."""
        self._latest: dict[str, Any] = {}
        self._shared: SharedWaiting | None = None
        """The round's shared count (`share`); None: each read is of the whole state."""

    @classmethod
    def attach(cls, handler: Any, endpoint: str, lost_after_seconds: float) -> StoreLink | None:
        """Watch ``handler``'s store and take over its ``num_nodes_waiting`` (a dynamic c10d/etcd handler only;
        the static backend reads nothing remote)."""
        if not can_count_spares(handler):
            return None
        link = cls(handler, endpoint, lost_after_seconds)
        handler.num_nodes_waiting = link.num_nodes_waiting  # the instance's, ahead of the class's method
        return link

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="trainguard-store-link", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def confirm(self, timeout_seconds: float) -> bool:
        """Whether the store answers a read sent from now on, within ``timeout_seconds``: asked before acting on
        a hang or a lost peer, which on a cut link are this node's own silence (and whose records need the
        store). Wakes the thread for an immediate read; waits at most the timeout."""
        if self._thread is None:
            return True
        asked = time.monotonic()
        self._wake.set()
        with self._answered:
            return self._answered.wait_for(lambda: self._last_ok_sent >= asked, timeout_seconds)

    def pause(self) -> None:
        """No reads from now on (a rendezvous round runs torch's own on the main thread)."""
        with self._probe:
            self._paused = True
            self._shared = None
            self._waiting = 0  # read before the round: the nodes it counted are in the job now, or gone

    def resume(self) -> None:
        """Reads again; the round that just completed counts as the store's answer."""
        with self._probe:
            self._paused = False
            self._waiting = 0
            self._error = None
            self._last_ok = time.monotonic()

    def share(self, lead: bool) -> None:
        """Read the wait-list count through the round just joined (`trainguard.launch.shared_waiting`):
        ``lead`` when this node has group rank 0 in it. Called on the main thread after `resume`."""
        store, round_no = store_of(self.handler), round_of(self.handler)
        if store is None or round_no is None:
            return
        try:
            run_id = str(self.handler.get_run_id())
        except Exception:  # a handler without a run id: keep reading the whole state
            return
        with self._probe:
            self._shared = SharedWaiting(store, run_id, round_no, lead, lambda: sync_waiting(self.handler))

    def touch(self) -> None:
        """The store just answered (a rendezvous round completed)."""
        self._last_ok = time.monotonic()

    def num_nodes_waiting(self) -> int:
        """torch's count of nodes waiting to join, as last read (never blocks the monitor loop); the last read's
        error when it failed (a store that refuses connections ends the run at once, as torch's own read did)."""
        if self._error is not None:
            raise self._error
        return self._waiting

    def add_reader(self, name: str, read: Callable[[], Any]) -> None:
        """Another store read to make on this thread after each answered state read; `latest` gives its result."""
        self._readers[name] = read

    def latest(self, name: str) -> Any:
        """The last result of reader ``name`` (None before its first)."""
        return self._latest.get(name)

    def silent_seconds(self, now: float | None = None) -> float:
        """Seconds since the store last answered."""
        return (time.monotonic() if now is None else now) - self._last_ok

    def fresh(self) -> bool:
        """The store answered within the last few reads: a read on the monitor thread will not hang."""
        return self.silent_seconds() < 3 * self.interval + 1.0

    def check(self) -> None:
        """Raise `RendezvousLostError` when the store has been silent past the limit."""
        silent = self.silent_seconds()
        if silent > self.lost_after_seconds:
            raise RendezvousLostError(
                f"no answer from the rendezvous store at {self.endpoint} for {silent:.0f} s: this node is cut off "
                "from the job (its network), or the store's host is lost")

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            sent = time.monotonic()
            with self._probe:
                if self._paused:
                    continue
                try:
                    shared = self._shared
                    self._waiting = shared.read() if shared is not None else sync_waiting(self.handler)
                except Exception as exc:  # unreachable, timed out, closed: the silence says it
                    self._error = exc
                    self._failures += 1
                    if self._failures == 1:
                        log.warning("rendezvous store at %s did not answer: %s", self.endpoint, exc)
                    continue
            if self._failures:
                log.warning("rendezvous store at %s answers again after %d failed reads", self.endpoint,
                            self._failures)
            self._failures = 0
            self._error = None
            with self._answered:
                self._last_ok = time.monotonic()
                self._last_ok_sent = sent
                self._answered.notify_all()
            for name, read in list(self._readers.items()):
                try:
                    self._latest[name] = read()
                except Exception as exc:
                    log.debug("store read %s failed: %s", name, exc)


class LinkedHandover:
    """A straggler hand-over whose announcements are read on the store link's thread: the monitor loop takes the
    last one read for its attempt and never waits on the store (`trainguard.stragglers.handover.Handover`)."""

    def __init__(self, inner: Any, link: StoreLink, attempt: Callable[[], int]) -> None:
        self.inner = inner
        self.link = link

        def read() -> tuple[int, Any]:
            number = attempt()
            return number, inner.announced(number)

        link.add_reader("announced", read)

    def announced(self, attempt: int) -> tuple[str, str] | None:
        latest = self.link.latest("announced")
        if latest is None or latest[0] != attempt:
            return None
        return latest[1]

    def announce(self, attempt: int, node: str, reason: str) -> None:
        self.inner.announce(attempt, node, reason)

    def spares_waiting(self) -> int:
        return int(self.inner.spares_waiting())
