"""Collective progress read from the flight recorder's per-group status, for the heartbeat.

The recorder's JSON dump without collectives (`trainguard.torch_api.c10d`) holds only the per-group counters
(``last_enqueued_collective``, ``last_completed_collective``): about 4 µs with 2,000 entries in the
buffer (measured on gloo, torch 2.13 CPU), against ~20 ms for a dump with the entries. It is polled
four times a second (`trainguard.worker.runtime.TICK_SECONDS`), and only once a default process group exists.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from trainguard.worker.control import torch_ready

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectiveStatus:
    """What one poll of the flight recorder says."""

    collectives_done: int
    """Collectives completed so far, summed over all process groups."""
    pending_since_mono: float
    """Monotonic time the oldest still-pending collective was first seen pending; 0 when none is."""


def read_pg_status() -> dict[str, Any] | None:
    """The flight recorder's ``pg_status`` (group id -> counters), or None when there is no process group."""
    if not torch_ready():
        return None
    try:
        import torch.distributed as dist

        from trainguard.torch_api.c10d import dump_flight_recorder

        if not dist.is_available() or not dist.is_initialized():
            return None
        raw = dump_flight_recorder("json", backend=dist.get_backend(), collectives=False)
        if raw is None:
            return None
        status = json.loads(raw).get("pg_status")
    except Exception as exc:
        log.debug("flight-recorder status unavailable: %s", exc)
        return None
    return status if isinstance(status, dict) else None


class CollectiveTracker:
    """Turns successive ``pg_status`` readings into `CollectiveStatus` (remembers when pending began)."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[int, float]] = {}  # group -> (oldest pending seq, first seen)

    def update(self, pg_status: dict[str, Any], now_mono: float) -> CollectiveStatus:
        done = 0
        since: list[float] = []
        for group, counters in pg_status.items():
            try:
                enqueued = int(counters["last_enqueued_collective"])
                completed = int(counters["last_completed_collective"])
            except (KeyError, TypeError, ValueError):
                continue
            done += max(completed, 0)
            if enqueued > completed:
                seq = completed + 1  # the oldest collective not completed yet
                seen = self._pending.get(group)
                if seen is None or seen[0] != seq:
                    seen = (seq, now_mono)
                    self._pending[group] = seen
                since.append(seen[1])
            else:
                self._pending.pop(group, None)
        return CollectiveStatus(done, min(since) if since else 0.0)
