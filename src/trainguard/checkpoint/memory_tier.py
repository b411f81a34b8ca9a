"""The memory tier of a `Checkpointer`: each rank's newest states in its node holder's memory and on a peer node.

Save: the state is copied once into a slot under /dev/shm (the stall); a background thread checksums it,
describes it (only then is it a valid copy) and pushes it to the holders `memory_placement` names (the
next node of a ring, or the rest of its clique). Restore, before storage: every rank lists the steps it
can get (own node's slots, replicas on any holder) and, in one collective, the ranks agree on the newest
step all of them have and that is not older than storage's newest; each rank then tries its own copy,
then the replicas, each verified by checksum and structure (`memory_load`), and the model is written
only once every rank verified one. Otherwise storage restores.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.checkpoint.checksum import default_algorithm
from trainguard.checkpoint.config import CheckpointConfig
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.groups import Collectives
from trainguard.checkpoint.memory_client import Address, HolderClient, ensure_holder, holder_address
from trainguard.checkpoint.memory_layout import digest, pack, plan
from trainguard.checkpoint.memory_load import OwnCopy, close_quietly, fetch_replica
from trainguard.checkpoint.memory_meta import CopyMeta
from trainguard.checkpoint.memory_placement import RING, parse_placement, replica_nodes
from trainguard.checkpoint.memory_store import GB, Copy, copies, describe, node_dir, rank_dir, replica_steps, run_id
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
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per part of the restore: ``listing`` (own copies, holder listing, the own copy's checksum
    started), ``agree`` (the one collective choosing the step), ``load`` (checksum wait or replica fetch),
    ``verdict`` (every rank verified?), ``copy`` (into the model)."""


class MemoryTier:
    """One rank's memory tier (see module doc). Save and restore are called by every rank together."""

    def __init__(
        self, config: CheckpointConfig, directory: Path, secret_dir: Path, comm: Collectives, node: str,
        emit: Callable[[Event], None], attempt: int, hooks: WriteHooks | None,
    ) -> None:
        assert config.memory_gb is not None
        self.config = config
        self.comm = comm
        self.node = node
        # The fastest installed, whatever storage uses: a memory copy is only ever read back by this tier,
        # which verifies it with the algorithm its description names.
        self.algorithm = default_algorithm()
        self.emit = emit
        self.attempt = attempt
        self.hooks = hooks
        self.bound = int(config.memory_gb * GB)
        self.placement = parse_placement(config.memory_placement or RING)
        self.node_dir = node_dir(Path(config.memory_root), run_id(directory), node, record=secret_dir)
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
            bind, advertise = holder_address(self.config.memory_address)
            own = ensure_holder(
                self.node_dir, self.node, self.signer, bind=bind, advertise=advertise, bound_bytes=self.bound,
            )
            self._own = own
            gathered = self.comm.all_gather(own, self.comm.ctl_pg)
            self._holders = sorted({a.node: a for a in gathered}.values(), key=lambda a: a.node)
        return self._holders

    def peers(self) -> list[Address]:
        """The holders that get a replica of this node's copies (``memory_placement``); none with one node
        or replicas off."""
        nodes = self.holders()
        if not self.config.memory_peer:
            return []
        by_node = {a.node: a for a in nodes}
        return [by_node[n] for n in replica_nodes(list(by_node), self.node, self.placement)]

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
        self.last_stall_seconds = time.perf_counter() - start
        self._pending = self._pool().submit(self._finish, directory, slot, mapped, meta, start,
                                            self.last_stall_seconds)

    def _finish(self, directory: Path, slot: int, mapped: mmap.mmap, meta: CopyMeta, start: float,
                stall: float) -> None:
        where, error = "memory:own", ""
        try:
            with memoryview(mapped) as view:
                with view[: meta.size] as data:
                    meta = dataclasses.replace(meta, checksum=digest(data, self.algorithm))
                describe(directory, slot, meta)
                for peer in self.peers():
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
    def restore(self, state: dict[str, Any], storage_newest: Callable[[], int | None]) -> MemoryRestore | None:
        """Load the newest step every rank holds in memory and not older than storage's newest committed step
        (``storage_newest``, asked on rank 0 only); None: use storage."""
        clock = _Phases()
        comm, rank = self.comm, self.comm.rank
        try:
            self.drain()
        except CheckpointError as exc:  # a failed replica push does not stop a restore
            log.warning("%s", exc)
        by_node = {a.node: a for a in self.holders()}
        own = {c.meta.step: c for c in copies(rank_dir(self.node_dir, "own", rank))
               if c.meta.rank == rank and c.meta.world_size == comm.world_size}
        # The newest own copy is checksummed in a thread while the ranks list and agree (network-bound).
        early: OwnCopy | None = None
        with contextlib.suppress(CheckpointError, OSError):  # a copy that cannot be mapped is rejected below
            early = OwnCopy.start(own[max(own)], self._pool()) if own else None
        try:
            # The replicas this node's holder has, read from its directory (the same files its ``list``
            # reads): no round trip to a process that may be waiting for a core.
            listing = replica_steps(self.node_dir)
            clock.mark("listing")
            storage_step = storage_newest() if rank == 0 else None
            gathered = comm.all_gather((self.node, listing, sorted(own), storage_step), comm.ctl_pg)
            where, common = _agree([g[:3] for g in gathered], rank, by_node)
            clock.mark("agree")
            floor = -1 if gathered[0][3] is None else gathered[0][3]
            payload = to_payload(state, rank)
            flat, mapping = flatten_state_dict(payload)
            for step in sorted((s for s in common if s >= floor), reverse=True):
                staged, tier, keep = self._load(step, own.get(step), where.get(step, []), flat, early)
                clock.mark("load")
                verdicts = comm.all_gather(tier, comm.ctl_pg)
                clock.mark("verdict")
                if all(verdicts):
                    write_back(payload, flat, staged, mapping, state, rank)
                    clock.mark("copy")
                    del staged
                    for buffer in keep:
                        close_quietly(buffer)
                    nbytes = tensor_bytes(flat)
                    self.emit(CheckpointLoaded(
                        time=time.time(), host=self.node, attempt=self.attempt, rank=rank, step=step,
                        seconds=clock.total(), path=f"memory:{tier}", bytes=nbytes,
                        tier="memory" if tier == "own" else "peer",
                    ))
                    return MemoryRestore(step, tier, nbytes, clock.phases)
                del staged
                for buffer in keep:
                    close_quietly(buffer)
                log.warning("memory checkpoint of step %d is not verified on every rank; trying older ones", step)
            return None
        finally:
            if early is not None:
                early.discard()

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="trainguard-memory")
        return self._executor

    def _load(
        self, step: int, own: Copy | None, replicas: list[Address], flat: dict[str, Any], early: OwnCopy | None
    ) -> tuple[dict[str, Any], str, list[mmap.mmap]]:
        """(staged values, tier or "", buffers to close) for this rank's copy of ``step``: own, then peers."""
        rank = self.comm.rank
        if own is not None:
            candidate = early if early is not None and early.copy == own else None
            try:
                if candidate is None:
                    candidate = OwnCopy.start(own, self._pool())
                return candidate.load(flat), "own", [candidate.mapped]
            except (CheckpointError, OSError) as exc:
                problem = str(exc)
                if candidate is not None and candidate is not early:
                    candidate.discard()
            self._rejected(step, f"own/rank-{rank}/slot-{own.slot}", problem)
            with contextlib.suppress(OSError):
                (own.data.parent / f"slot-{own.slot}.json").unlink()  # never offered again
        for address in replicas:
            try:
                staged, data = fetch_replica(address, self.signer, self.config.timeout_seconds, step, rank,
                                             self.comm.world_size, flat)
                return staged, f"peer:{address.node}", [data]
            except (CheckpointError, OSError) as exc:
                self._rejected(step, f"peer:{address.node}/rank-{rank}", str(exc))
        return {}, "", []

    def _rejected(self, step: int, where: str, reason: str) -> None:
        log.warning("memory checkpoint %s of step %d rejected: %s", where, step, reason)
        self.emit(CheckpointRejected(time=time.time(), host=self.node, attempt=self.attempt, step=step,
                                     path=f"memory:{where}", reason=reason))


class _Phases:
    """Seconds spent in each part of a restore (`MemoryRestore.phases`), for profiling."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.last
        self.last = now

    def total(self) -> float:
        return time.perf_counter() - self.start


def _agree(
    gathered: list[tuple[str, dict[int, list[int]], list[int]]], rank: int, by_node: dict[str, Address]
) -> tuple[dict[int, list[Address]], set[int]]:
    """From every rank's (node, its holder's replica listing, own steps): where this rank's replicas of
    each step are, and the steps every rank can get (own copy or a replica anywhere)."""
    steps = [set(own) for _, _, own in gathered]
    where: dict[int, list[Address]] = {}
    listings = {node: listing for node, listing, _ in gathered}  # one per node: its ranks list the same holder
    for node, listing in sorted(listings.items()):
        for held_rank, held in listing.items():
            if 0 <= held_rank < len(steps):
                steps[held_rank].update(held)
            if held_rank == rank and node in by_node:
                for step in held:
                    where.setdefault(step, []).append(by_node[node])
    return where, set.intersection(*steps)
