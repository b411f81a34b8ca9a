"""`CheckpointConfig`: what a `Checkpointer` saves where, how often and how many; validated on construction.

Pure: no torch. Bad values raise ``ValueError`` naming the field, when the config is built.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from trainguard.checkpoint.checksum import available
from trainguard.checkpoint.interval import IntervalPolicy
from trainguard.checkpoint.memory_placement import parse_placement


def _every_100_steps() -> IntervalPolicy:
    return IntervalPolicy.every_steps(100)


@dataclass(frozen=True)
class CheckpointConfig:
    """How a `Checkpointer` saves and keeps checkpoints (docs/checkpoint.md)."""

    directory: str | os.PathLike[str] | None = None
    """Where checkpoints go; None: ``<run dir>/checkpoints`` of the worker the checkpointer is built with."""
    interval: IntervalPolicy = field(default_factory=_every_100_steps)
    """When `Checkpointer.should_save` says a step is due (every N steps, T seconds, or Young/Daly)."""
    async_save: bool = True
    """Return from `save` once the state is copied to host memory; shards are written in the background."""
    keep_last: int = 3
    """Committed checkpoints kept (newest first); older ones are removed after each commit."""
    keep_every: int | None = None
    """Also keep every checkpoint whose step is a multiple of this (None: none besides ``keep_last``)."""
    timeout_seconds: float = 600.0
    """Timeout of the checkpointer's own gloo groups: a rank dead mid-save fails the save after this."""
    checksum: str | None = None
    """``xxh3_64`` or ``crc32``; None: the fastest one installed."""
    memory_gb: float | None = None
    """Memory tier: GiB of host memory each node may hold for it (own copies and replicas held for other
    nodes, both slots); a save that does not fit is refused. None: no memory tier (docs/checkpoint.md)."""
    memory_peer: bool = True
    """Memory tier: also push each copy to other nodes' holders (where: ``memory_placement``)."""
    memory_placement: str | None = None
    """Memory tier: which nodes get a replica of a node's copies: ``ring`` (the next node, by node id) or
    ``clique:K`` (nodes cut into cliques of K consecutive node ids, K >= 2; every other node of the clique).
    None: the launcher's ``--memory-checkpoint-placement`` (``TRAINGUARD_MEMORY_CHECKPOINT_PLACEMENT``), else ring."""
    memory_every_steps: int | None = None
    """Memory tier: `Checkpointer.should_save_to_memory` is true every this many steps (None: never; every
    storage `save` also copies to memory)."""
    memory_root: str = "/dev/shm"
    """Memory tier: where the node's copies live (a tmpfs: memory that outlives the worker processes)."""
    memory_address: str | None = None
    """Memory tier: the address this node's holder listens on and other nodes reach it at; None: loopback
    for a one-node job, else this host's address on the route to the job's master (``$MASTER_ADDR``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.interval, IntervalPolicy):
            raise ValueError(f"CheckpointConfig.interval must be an IntervalPolicy, got {type(self.interval).__name__}")
        if not _count(self.keep_last):
            raise ValueError(f"CheckpointConfig.keep_last must be an integer >= 1, got {self.keep_last!r}")
        if self.keep_every is not None and not _count(self.keep_every):
            raise ValueError(f"CheckpointConfig.keep_every must be None or an integer >= 1, got {self.keep_every!r}")
        if not (isinstance(self.timeout_seconds, (int, float)) and math.isfinite(self.timeout_seconds)
                and self.timeout_seconds > 0):
            raise ValueError(f"CheckpointConfig.timeout_seconds must be > 0, got {self.timeout_seconds!r}")
        if self.checksum is not None and self.checksum not in available():
            raise ValueError(
                f"CheckpointConfig.checksum {self.checksum!r} is not available here "
                f"(installed: {', '.join(available())})"
            )
        if self.memory_gb is not None and not (
            isinstance(self.memory_gb, (int, float)) and math.isfinite(self.memory_gb) and self.memory_gb > 0
        ):
            raise ValueError(f"CheckpointConfig.memory_gb must be None or > 0, got {self.memory_gb!r}")
        if self.memory_every_steps is not None and not _count(self.memory_every_steps):
            raise ValueError(
                f"CheckpointConfig.memory_every_steps must be None or an integer >= 1, got {self.memory_every_steps!r}"
            )
        if self.memory_placement is not None:
            try:
                parse_placement(self.memory_placement)
            except ValueError as exc:
                raise ValueError(f"CheckpointConfig.memory_placement: {exc}") from None
        if self.directory is not None and not str(os.fspath(self.directory)):
            raise ValueError("CheckpointConfig.directory must not be empty (None: the run directory's checkpoints/)")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
