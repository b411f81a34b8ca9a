"""Reading one rank's memory-tier copy for a restore: checked against its description before any byte is used.

An own copy is mapped from /dev/shm and checksummed in a thread (`OwnCopy.start`, begun before the ranks
agree on a step, so the pass overlaps their collectives); a replica is checksummed as it arrives from
the peer's holder (`fetch_replica`). Either gives staged tensor views that `restore.write_back` copies
into the model once every rank verified its copy: one read of the copy for the checksum, one copy.
"""

from __future__ import annotations

import contextlib
import mmap
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.memory_client import Address, HolderClient
from trainguard.checkpoint.memory_layout import check_structure, digest, unpack, verify
from trainguard.checkpoint.memory_meta import CopyMeta
from trainguard.checkpoint.memory_store import Copy, map_copy
from trainguard.launch.store_auth import StoreSigner


def close_quietly(buffer: mmap.mmap) -> None:
    with contextlib.suppress(BufferError):  # views still alive: the collector closes it
        buffer.close()


@dataclass
class OwnCopy:
    """An own copy mapped, its checksum being computed."""

    copy: Copy
    mapped: mmap.mmap
    checksum: Future[str]

    @classmethod
    def start(cls, copy: Copy, executor: Executor) -> OwnCopy:
        """Map ``copy`` and start its checksum on ``executor``; `CheckpointError` when it cannot be mapped."""
        mapped = map_copy(copy)
        return cls(copy, mapped, executor.submit(_digest_of, mapped, copy.meta))

    def load(self, flat: dict[str, Any]) -> dict[str, Any]:
        """Staged views of the verified copy; `CheckpointError` saying why it is not the described copy."""
        try:
            check_structure(self.copy.meta, flat)  # needs no data: decided while the checksum runs
            problem = verify(self.copy.meta, memoryview(self.mapped), self.checksum.result())
        except ValueError as exc:  # an algorithm this installation lacks
            problem = str(exc)
        if problem:
            raise CheckpointError(problem)
        return unpack(self.copy.meta, memoryview(self.mapped), flat)

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            self.checksum.result()  # the thread reads the mapping: it must be done before the unmap
        close_quietly(self.mapped)


def _digest_of(mapped: mmap.mmap, meta: CopyMeta) -> str:
    with memoryview(mapped) as view:
        if len(view) < meta.size:
            return ""  # verify reports the truncation
        with view[: meta.size] as data:
            return digest(data, meta.algorithm)


def fetch_replica(
    address: Address, signer: StoreSigner, timeout: float, step: int, rank: int, world_size: int,
    flat: dict[str, Any],
) -> tuple[dict[str, Any], mmap.mmap]:
    """Staged views of ``rank``'s replica of ``step`` on ``address``'s holder, verified, and the buffer
    they live in; `CheckpointError` (or `OSError`) when it is missing, another copy, or damaged."""
    meta, data, computed = HolderClient(address, signer, timeout).get(rank, step)
    try:
        problem = verify(meta, memoryview(data), computed)
        if not problem and (meta.step, meta.rank, meta.world_size) != (step, rank, world_size):
            problem = f"replica holds rank {meta.rank} step {meta.step} of {meta.world_size} ranks"
        if problem:
            raise CheckpointError(problem)
        return unpack(meta, memoryview(data), flat), data
    except BaseException:
        close_quietly(data)
        raise
