"""The checkpointer's two gloo groups and the object collectives it runs on them.

Background saves use the ``save`` group; the main thread's agreements (staging token, restore choice,
time-based decisions) use the ``control`` group, so the two never interleave. Without a process group
every collective is the identity (single-process use).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


class Collectives:
    """Rank, world size and object collectives of one checkpointer; groups are created on first need."""

    def __init__(self, save_group: Any, timeout_seconds: float) -> None:
        self.save_pg: Any = save_group
        """Group of the background save (its own gloo group unless the caller passed one)."""
        self.ctl_pg: Any = None
        """Group of the main thread's agreements."""
        self.timeout_seconds = timeout_seconds
        self.ready = False

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    @property
    def rank(self) -> int:
        return dist.get_rank() if self.distributed else 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if self.distributed else 1

    def create(self) -> bool:
        """Create the groups (collective: every rank calls it); False when there is nothing to create."""
        if self.ready or not self.distributed:
            return False
        timeout = timedelta(seconds=self.timeout_seconds)
        if self.save_pg is None:
            self.save_pg = dist.new_group(backend="gloo", timeout=timeout)
        self.ctl_pg = dist.new_group(backend="gloo", timeout=timeout)
        self.ready = True
        return True

    def broadcast(self, obj: Any, group: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=group)
        return box[0]

    def all_gather(self, obj: Any, group: Any) -> list[Any]:
        """Every rank's ``obj``, by rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=group)
        return out

    def all_gather_flagged(self, obj: Any, flagged: bool, group: Any) -> list[Any]:
        """`all_gather` of ``obj`` for agreements where every unflagged rank passes the same ``obj`` (a "no
        problem" value): when no rank flagged, one all-reduce of one number answers ``[obj] * world_size``.
        An object all-gather costs ~7x that on gloo (1.3 ms against 0.2 ms measured, 2 ranks on loopback)."""
        if not self.distributed:
            return [obj]
        flag = torch.tensor([1 if flagged else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        if not int(flag.item()):
            return [obj] * self.world_size
        return self.all_gather(obj, group)
