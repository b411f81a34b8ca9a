"""Restore: pick the newest checkpoint every rank can use, load it in one verified read, fall back on damage.

Each candidate (newest first) is checked cheaply on every rank (manifest, structure, file sizes), then
loaded by DCP through `VerifyingReader` while every byte is hashed. Where an older committed checkpoint is
left to fall back on, the load goes straight into the caller's tensors (the copy a staged load needs
afterwards is most of what separated it from plain ``dcp.load``); if any rank's files then fail to verify,
the older checkpoint is loaded over them, so the state never keeps a rejected byte. The last candidate is
loaded into staging buffers (`trainguard.checkpoint.staging`) and written back only once every rank agreed
that every file verified: with nothing older to fall back on, damage leaves the state as it was. A damaged
checkpoint is reported, moved aside, and the next older one is tried. Non-tensor values are always
assigned only after verification.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from trainguard.checkpoint.checksum import available
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.groups import Collectives
from trainguard.checkpoint.manifest import (
    Manifest,
    committed_steps,
    read_manifest,
    require_loadable,
    step_dir,
    structure_mismatch,
    verify_files,
)
from trainguard.checkpoint.reader import VerifyingReader
from trainguard.checkpoint.saving import describe_error
from trainguard.checkpoint.staging import StagingArena
from trainguard.checkpoint.structure import RANK_LOCAL_KEY, RANK_LOCAL_STORED, assign, describe, tensor_bytes
from trainguard.core.events import CheckpointLoaded, CheckpointRejected, Event
from trainguard.torch_api.dcp import flatten_state_dict
from trainguard.worker import ckpt_io

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restored:
    """What a successful restore loaded."""

    step: int
    """The step of the checkpoint loaded."""
    path: Path
    """Its directory."""
    nbytes: int
    """Tensor bytes of the state it filled."""
    read_bytes: int
    """Bytes this rank read from the checkpoint (each once)."""


def to_payload(state: dict[str, Any], rank: int) -> dict[str, Any]:
    """The DCP state for ``state``: its rank-local entry stored under this rank's key."""
    payload = {k: v for k, v in state.items() if k != RANK_LOCAL_KEY}
    if RANK_LOCAL_KEY in state:
        payload[RANK_LOCAL_STORED] = {str(rank): state[RANK_LOCAL_KEY]}
    return payload


def write_back(
    payload: dict[str, Any], flat: dict[str, Any], staged: dict[str, Any], mapping: Any, state: dict[str, Any],
    rank: int,
) -> None:
    """Copy a verified staged state into the caller's tensors and containers (every tier's last step)."""
    with torch.no_grad():
        for fqn, value in flat.items():
            if isinstance(value, torch.Tensor):
                if staged[fqn] is not value:
                    value.copy_(staged[fqn])
            else:
                assign(payload, tuple(mapping[fqn]), staged[fqn])
    for key in state:
        if key == RANK_LOCAL_KEY:
            state[key] = payload[RANK_LOCAL_STORED][str(rank)]
        else:
            state[key] = payload[key]


class Restorer:
    """Runs one restore for a checkpointer (see module doc); every rank calls `restore` together."""

    def __init__(
        self,
        directory: Path,
        comm: Collectives,
        emit: Callable[[Event], None],
        host: str,
        attempt: int,
        arena: StagingArena | None = None,
    ) -> None:
        self.directory = directory
        self.arena = arena if arena is not None else StagingArena()
        """Host memory the load goes to before it is verified (the checkpointer's, kept between restores)."""
        self.comm = comm
        self.emit = emit
        self.host = host
        self.attempt = attempt

    def restore(self, state: dict[str, Any]) -> Restored | None:
        """Load the newest usable checkpoint into ``state``; None when there is none (see Checkpointer.restore)."""
        comm, rank = self.comm, self.comm.rank
        start = time.perf_counter()
        payload = to_payload(state, rank)
        flat, mapping = flatten_state_dict(payload)
        wanted = describe(flat)
        own = f"{RANK_LOCAL_STORED}.{rank}"
        steps: list[int] = comm.broadcast(self._candidates(), comm.ctl_pg)
        mismatches: list[str] = []
        dirty: int | None = None  # the rejected step whose unverified bytes the state's tensors hold
        for index, step in enumerate(steps):
            path = step_dir(self.directory, step)
            manifest, reason, kind = self._check(path, wanted, own)
            reasons = comm.all_gather_flagged((reason, kind), bool(reason), comm.ctl_pg)
            if not any(r for r, _ in reasons) and manifest is not None:
                # Every rank has the same list, so every rank takes the same branch.
                in_place = index + 1 < len(steps)
                staged, load_error, read = self._load(path, manifest, flat, in_place)
                # DCP agrees on its own errors; this makes every other failure agreed too.
                errors = comm.all_gather_flagged(load_error, bool(load_error), comm.ctl_pg)
                reasons = [(e, "corrupt" if e else "") for e in errors]
                if not any(r for r, _ in reasons):
                    self._write_back(payload, flat, staged, mapping, state)
                    self._loaded(step, path, start, tensor_bytes(flat))
                    return Restored(step, path, tensor_bytes(flat), read)
                if in_place and dirty is None:
                    dirty = step
            who, (reason, kind) = next((r, x) for r, x in enumerate(reasons) if x[0])
            self._reject(step, path, f"rank {who}: {reason}", kind)
            if kind in ("structure", "unverifiable"):
                mismatches.append(f"step {step}: {reason}")
        if dirty is not None:
            raise CheckpointError(
                f"no checkpoint in {self.directory} verified, and the state's tensors hold unverified bytes of "
                f"rejected step {dirty} (it was loaded in place with older checkpoints to fall back on): "
                "initialize the state again before training from scratch"
            )
        if mismatches:
            raise CheckpointError(f"no checkpoint in {self.directory} matches the state: {mismatches[0]}")
        return None

    def _candidates(self) -> list[int]:
        """Rank 0's list of committed steps, newest first; an unreadable directory lists none."""
        if self.comm.rank != 0:
            return []
        try:
            return committed_steps(self.directory)
        except OSError as exc:
            log.warning("cannot list checkpoints in %s: %s", self.directory, exc)
            return []

    def _check(self, path: Path, wanted: dict[str, Any], own: str) -> tuple[Manifest | None, str, str]:
        """(manifest, reason, kind): why this rank cannot use ``path``, reason ``""`` when it looks usable.

        Never raises: whatever goes wrong reading a checkpoint makes it corrupt on this rank, and the
        all-gather that follows makes that the verdict of every rank. Checksums are checked by the load.
        """
        try:
            return self._check_unsafe(path, wanted, own)
        except CheckpointError as exc:
            return None, str(exc), "corrupt"
        except Exception as exc:
            return None, f"unreadable ({exc.__class__.__name__}: {str(exc)[:200]})", "corrupt"

    def _check_unsafe(self, path: Path, wanted: dict[str, Any], own: str) -> tuple[Manifest | None, str, str]:
        manifest = read_manifest(path)
        require_loadable(manifest)
        saved = {
            k: v
            for k, v in manifest.structure.items()
            if not k.startswith(RANK_LOCAL_STORED) or k == own or k.startswith(own + ".")
        }
        if manifest.checksum_algorithm not in available():
            reason = f"checksum {manifest.checksum_algorithm} cannot be verified here (pip install xxhash)"
            return None, reason, "unverifiable"
        world = self.comm.world_size
        problem = structure_mismatch(saved, wanted)
        if not problem and manifest.world_size != world and any(k.startswith(own) for k in wanted):
            problem = f"rank-local state was saved by {manifest.world_size} ranks, this job has {world}"
        if problem:
            return None, problem, "structure"
        # Sizes only (no read): a missing or truncated shard is caught here, before any collective load.
        verify_files(path, manifest, sorted(manifest.files)[self.comm.rank :: world], checksums=False)
        return manifest, "", ""

    def _load(
        self, path: Path, manifest: Manifest, flat: dict[str, Any], in_place: bool
    ) -> tuple[dict[str, Any], str, int]:
        """(loaded state, error or "", bytes read): one DCP load through the verifying reader, into the
        caller's own tensors (``in_place``) or into staging memory."""
        # A new dict either way: DCP replaces non-tensor values in it, assigned to the state after verification.
        staged = dict(flat) if in_place else self.arena.state(flat)
        reader = VerifyingReader(path, manifest)
        try:
            with ckpt_io.quiet():  # reported by the checkpointer's own record, not again as a DCP call
                dcp.load(staged, storage_reader=reader, process_group=self.comm.ctl_pg,
                         no_dist=not self.comm.distributed)
        except BaseException as exc:  # DCP's CheckpointException derives from BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return staged, f"load failed: {describe_error(exc)}", reader.bytes_read
        return staged, "", reader.bytes_read

    def _write_back(
        self, payload: dict[str, Any], flat: dict[str, Any], staged: dict[str, Any], mapping: Any,
        state: dict[str, Any],
    ) -> None:
        write_back(payload, flat, staged, mapping, state, self.comm.rank)

    def _reject(self, step: int, path: Path, reason: str, kind: str) -> None:
        log.warning("checkpoint %s rejected: %s", path, reason)
        if self.comm.rank != 0:
            return
        self.emit(
            CheckpointRejected(
                time=time.time(), host=self.host, attempt=self.attempt, step=step, path=str(path), reason=reason
            )
        )
        if kind == "corrupt":  # a structure mismatch or an unverifiable checksum is no proof of damage
            try:
                os.rename(path, self.directory / f".rejected-step-{step}-{secrets.token_hex(4)}")
            except OSError as exc:
                log.warning("cannot move rejected checkpoint %s aside: %s", path, exc)

    def _loaded(self, step: int, path: Path, start: float, nbytes: int) -> None:
        self.emit(
            CheckpointLoaded(
                time=time.time(),
                host=self.host,
                attempt=self.attempt,
                rank=self.comm.rank,
                step=step,
                seconds=time.perf_counter() - start,
                path=str(path),
                bytes=nbytes,
            )
        )
