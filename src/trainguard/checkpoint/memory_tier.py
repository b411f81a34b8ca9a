"""The memory tier of a `Checkpointer`: each rank's newest states in its node holder's memory and on a peer node.

Save: the state is copied once into a slot under /dev/shm (the stall); a background thread checksums it,
describes it (only then is it a valid copy) and pushes it to the next node's holder (ring placement over
the job's node ids). Restore, before storage: every rank lists the steps it can get (own node's slots,
replicas on any holder) and the ranks agree on the newest step all of them have and that is not older
than storage's newest; each rank then tries its own copy, then the replicas, each verified by checksum
and structure, and the model is written only once every rank verified one. Otherwise storage restores.
docs/checkpoint.md ("Memory tier").
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mmap
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.checkpoint.config import CheckpointConfig
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.groups import Collectives
from trainguard.checkpoint.memory_client import Address, HolderClient, ensure_holder
from trainguard.checkpoint.memory_layout import digest, pack, plan, unpack, verify
from trainguard.checkpoint.memory_meta import CopyMeta
from trainguard.checkpoint.memory_store import GB, copies, describe, map_copy, node_dir, rank_dir, run_id
from trainguard.checkpoint.memory_store import begin as begin_slot
from trainguard.checkpoint.restore import to_payload, write_back
from trainguard.checkpoint.structure import tensor_bytes
from trainguard.checkpoint.writer import WriteHooks
from trainguard.core.events import (
    CheckpointLoaded,
    CheckpointRejected,
    CheckpointSaveFinished,
    CheckpointSaveStarted,
    Event,
)
from trainguard.launch.store_auth import StoreSigner, job_signer
from trainguard.torch_api.dcp import flatten_state_dict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryRestore:
    """What a memory-tier restore loaded on this rank."""

    step: int
    tier: str
    """``own`` (this node's memory) or ``peer:<node>`` (a replica on that node's holder)."""
    nbytes: int
    """Tensor bytes restored."""


class MemoryTier:
    """One rank's memory tier (see module doc). Save and restore are called by every rank together."""

    def __init__(
        self, config: CheckpointConfig, directory: Path, secret_dir: Path, comm: Collectives, node: str,
        algorithm: str, emit: Callable[[Event], None], attempt: int, hooks: WriteHooks | None,
    ) -> None:
        assert config.memory_gb is not None
        self.config = config
        self.comm = comm
        self.node = node
        self.algorithm = algorithm
        self.emit = emit
        self.attempt = attempt
        self.hooks = hooks
        self.bound = int(config.memory_gb * GB)
        self.node_dir = node_dir(Path(config.memory_root), run_id(directory), node)
        self._secret_dir = secret_dir
        self._signer: StoreSigner | None = None
        self._holders: list[Address] | None = None
        self._own: Address | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self.last_stall_seconds = 0.0

    # --- holders ---------------------------------------------------------------------------------
    @property
    def signer(self) -> StoreSigner:
        if self._signer is None:
            self._signer = job_signer(self._secret_dir)
        return self._signer

    def holders(self) -> list[Address]:
        """Every node's holder, by node id (collective on first call: each rank ensures its node's)."""
        if self._holders is None:
            address = self.config.memory_address
            own = ensure_holder(
                self.node_dir, self.node, self.signer, bind=address or "0.0.0.0",
                advertise=address or _hostname(), bound_bytes=self.bound,
            )
            self._own = own
            gathered = self.comm.all_gather(own, self.comm.ctl_pg)
            self._holders = sorted({a.node: a for a in gathered}.values(), key=lambda a: a.node)
        return self._holders

    def peer(self) -> Address | None:
        """The next node in the ring of node ids; None with one node or replicas off."""
        nodes = self.holders()
        if not self.config.memory_peer or len(nodes) < 2:
            return None
        index = next(i for i, a in enumerate(nodes) if a.node == self.node)
        return nodes[(index + 1) % len(nodes)]

    # --- save ------------------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any]) -> None:
        """Copy ``state`` into this node's memory (returns then); checksum and replica follow in the background.

        Raises `CheckpointError` when the copy does not fit the node's bound, or when the previous
        memory save's background part failed.
        """
        start_wall, start = time.time(), time.perf_counter()
        self.emit(CheckpointSaveStarted(time=start_wall, host=self.node, attempt=self.attempt, rank=self.comm.rank,
                                        step=step, tier="memory"))
        try:
            self._copy(step, state, start)
        except Exception as exc:
            stall = time.perf_counter() - start
            self._finished(step, start, stall, 0, "memory:own", f"{exc.__class__.__name__}: {exc}")
            raise

    def _copy(self, step: int, state: dict[str, Any], start: float) -> None:
        """The blocking part of `save`: the copy into this node's slot; then the background part is queued."""
        rank = self.comm.rank
        self.drain()
        self.holders()
        flat, _ = flatten_state_dict(to_payload(state, rank))
        layout = plan(flat)
        directory = rank_dir(self.node_dir, "own", rank)
        slot, mapped = begin_slot(self.node_dir, directory, layout.size, self.bound, f"rank {rank}")
        try:
            with memoryview(mapped) as whole:
                if self.hooks is not None:
                    with whole[: layout.size // 2] as half:
                        self.hooks.during_memory_copy(step, half)
                pack(flat, layout, whole)
        except BaseException:
            with contextlib.suppress(BufferError):  # a view the traceback still holds: the collector closes it
                mapped.close()
            raise
        meta = CopyMeta(step, rank, self.comm.world_size, self.algorithm, "", layout.size, layout.entries,
                        (layout.objects_offset, len(layout.objects_blob)))
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="trainguard-memory")
        self.last_stall_seconds = time.perf_counter() - start
        self._pending = self._executor.submit(self._finish, directory, slot, mapped, meta, start,
                                              self.last_stall_seconds)

    def _finish(self, directory: Path, slot: int, mapped: mmap.mmap, meta: CopyMeta, start: float,
                stall: float) -> None:
        where, error = "memory:own", ""
        try:
            with memoryview(mapped) as view:
                with view[: meta.size] as data:
                    meta = dataclasses.replace(meta, checksum=digest(data, self.algorithm))
                describe(directory, slot, meta)
                peer = self.peer()
                if peer is not None:
                    HolderClient(peer, self.signer, self.config.timeout_seconds).put(meta, view)
                    where += f"+peer:{peer.node}"
        except BaseException as exc:
            error = f"{exc.__class__.__name__}: {exc}"
            raise
        finally:
            with contextlib.suppress(BufferError):
                mapped.close()
            # Checksummed and replicated (or failed): the memory copy's counterpart of a storage commit.
            self._finished(meta.step, start, stall, meta.size, where, error)

    def _finished(self, step: int, start: float, stall: float, nbytes: int, where: str, error: str) -> None:
        self.emit(CheckpointSaveFinished(
            time=time.time(), host=self.node, attempt=self.attempt, rank=self.comm.rank, step=step,
            blocking_seconds=stall, total_seconds=time.perf_counter() - start, bytes=nbytes, path=where,
            ok=not error, error=error, tier="memory",
        ))

    def drain(self) -> None:
        """Wait for the background part of the last save; `CheckpointError` if it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except (OSError, CheckpointError) as exc:
            raise CheckpointError(f"memory checkpoint replica failed: {exc}") from exc

    def close(self) -> None:
        try:
            self.drain()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)

    # --- restore ---------------------------------------------------------------------------------
    def restore(self, state: dict[str, Any], storage_step: int | None) -> MemoryRestore | None:
        """Load the newest step every rank holds in memory (not older than ``storage_step``); None: use storage."""
        start = time.perf_counter()
        comm, rank = self.comm, self.comm.rank
        try:
            self.drain()
        except CheckpointError as exc:  # a failed replica push does not stop a restore
            log.warning("%s", exc)
        holders = self.holders()
        own = {c.meta.step: c for c in copies(rank_dir(self.node_dir, "own", rank))
               if c.meta.rank == rank and c.meta.world_size == comm.world_size}
        assert self._own is not None
        listing = _quietly(lambda: HolderClient(self._own, self.signer, 10.0).replicas(), {})  # type: ignore[arg-type]
        where: dict[int, list[Address]] = {}
        by_node = {a.node: a for a in holders}
        for node, held in comm.all_gather((self.node, listing), comm.ctl_pg):
            for step in held.get(rank, []):
                where.setdefault(step, []).append(by_node[node])
        mine = sorted(set(own) | set(where))
        common = set.intersection(*(set(s) for s in comm.all_gather(mine, comm.ctl_pg)))
        floor = -1 if storage_step is None else storage_step
        payload = to_payload(state, rank)
        flat, mapping = flatten_state_dict(payload)
        for step in sorted((s for s in common if s >= floor), reverse=True):
            staged, tier, keep = self._load(step, own.get(step), where.get(step, []), flat)
            verdicts = comm.all_gather(tier, comm.ctl_pg)
            if all(verdicts):
                write_back(payload, flat, staged, mapping, state, rank)
                del staged
                for buffer in keep:
                    if isinstance(buffer, mmap.mmap):
                        with contextlib.suppress(BufferError):  # views still alive: the collector closes it
                            buffer.close()
                nbytes = tensor_bytes(flat)
                self.emit(CheckpointLoaded(
                    time=time.time(), host=self.node, attempt=self.attempt, rank=rank, step=step,
                    seconds=time.perf_counter() - start, path=f"memory:{tier}", bytes=nbytes,
                    tier="memory" if tier == "own" else "peer",
                ))
                return MemoryRestore(step, tier, nbytes)
            log.warning("memory checkpoint of step %d is not verified on every rank; trying older ones", step)
        return None

    def _load(
        self, step: int, own: Any, replicas: list[Address], flat: dict[str, Any]
    ) -> tuple[dict[str, Any], str, list[object]]:
        """(staged values, tier or "", buffers to close) for this rank's copy of ``step``: own, then peers."""
        rank = self.comm.rank
        if own is not None:
            try:
                mapped = map_copy(own)
                problem = verify(own.meta, memoryview(mapped))
                if not problem:
                    return unpack(own.meta, memoryview(mapped), flat), "own", [mapped]
                mapped.close()
            except CheckpointError as exc:
                problem = str(exc)
            self._rejected(step, f"own/rank-{rank}/slot-{own.slot}", problem)
            with contextlib.suppress(OSError):
                (own.data.parent / f"slot-{own.slot}.json").unlink()  # never offered again
        for address in replicas:
            try:
                meta, data = HolderClient(address, self.signer, self.config.timeout_seconds).get(rank, step)
                problem = verify(meta, memoryview(data))
                if not problem and (meta.step, meta.rank, meta.world_size) != (step, rank, self.comm.world_size):
                    problem = f"replica holds rank {meta.rank} step {meta.step} of {meta.world_size} ranks"
                if not problem:
                    return unpack(meta, memoryview(data), flat), f"peer:{address.node}", [data]
            except (CheckpointError, OSError) as exc:
                problem = str(exc)
            self._rejected(step, f"peer:{address.node}/rank-{rank}", problem)
        return {}, "", []

    def _rejected(self, step: int, where: str, reason: str) -> None:
        log.warning("memory checkpoint %s of step %d rejected: %s", where, step, reason)
        self.emit(CheckpointRejected(time=time.time(), host=self.node, attempt=self.attempt, step=step,
                                     path=f"memory:{where}", reason=reason))


def _quietly(call: Callable[[], Any], default: Any) -> Any:
    try:
        return call()
    except (CheckpointError, OSError) as exc:
        log.warning("memory holder unreachable: %s", exc)
        return default


def _hostname() -> str:
    import socket

    return socket.gethostname()
