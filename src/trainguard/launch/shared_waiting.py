"""The rendezvous wait-list count, read by one node per round and shared with the others through two small keys.

To see a node waiting to join, every agent's store link (`trainguard.launch.store_link`) read torch's whole
rendezvous state once a second: one object listing every participant and its keep-alive, so O(N) bytes per read
and O(N^2) per second for the job, restarts or not. At 16 hosts that was a large part of a restart's store bytes
(docs/operations.md); at 2,048 hosts (~400 kB of state) it would be ~0.8 GB/s through the store's host. Now the
round's leader (group rank 0) reads the state and publishes the count under two integer keys of that round; the
others read the integers. A follower reads the state itself while no leader has published in the round yet, and
when the leader's beat stopped moving (it is in a new rendezvous, stopped or gone): never a count older than a few
reads. Integers through ``add`` because every store has it and it never blocks (``get`` waits for a missing key).

The integers cannot carry the job's signature (torch's state does: `trainguard.launch.signed_rendezvous`), so they
only ever say "nobody waits": a follower that reads a count above zero reads the signed state itself before its
agent acts. A forged count costs that read, not a restart; a forged beat can only delay a late node's admission
while the forger keeps writing (docs/security.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "trainguard/{run}/waiting/{round}/"
STALE_READS = 3
"""A follower whose leader's beat has not moved in this many reads reads the state itself."""


class SharedWaiting:
    """One node's view of the wait-list count in one rendezvous round."""

    def __init__(self, store: Any, run_id: str, round_no: int, lead: bool, full_read: Callable[[], int]) -> None:
        self.store = store
        self.lead = lead
        """This node leads the round: it reads the whole state and publishes the count."""
        self.full_read = full_read
        """Reads torch's whole rendezvous state and returns its wait-list length (a store round trip)."""
        prefix = PREFIX.format(run=run_id, round=round_no)
        self._count_key, self._beat_key = prefix + "count", prefix + "beat"
        self._published = 0
        self._last_beat = 0
        self._same = 0
        self.full_reads = 0
        """Whole-state reads this node made (the leader's, and a follower's fallbacks)."""

    def read(self) -> int:
        """Nodes waiting to join, as of this read (raises what a store read raises: the link watches that)."""
        if self.lead:
            count = self._full()
            if count != self._published:
                self.store.add(self._count_key, count - self._published)
                self._published = count
            self.store.add(self._beat_key, 1)
            return count
        beat = int(self.store.add(self._beat_key, 0))
        if beat != self._last_beat:
            self._last_beat, self._same = beat, 0
        else:
            self._same += 1
        if beat == 0 or self._same >= STALE_READS:  # no leader has published yet, or it stopped
            return self._full()
        if int(self.store.add(self._count_key, 0)) > 0:  # unsigned: confirmed from the signed state before use
            return self._full()
        return 0

    def _full(self) -> int:
        self.full_reads += 1
        return self.full_read()
