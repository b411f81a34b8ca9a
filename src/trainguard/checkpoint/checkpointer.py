"""`Checkpointer`: sharded DCP saves with atomic commit, verified restore with fallback, async saves.

Protocol (details in docs/checkpoint.md): every rank writes its shard into ``.staging-step-N-<id>/``
while checksumming it; the ranks exchange sizes and checksums; rank 0 writes ``manifest.json``,
renames the directory to ``step-N/`` and fsyncs the parent; the outcome is broadcast so every rank
reports (and later raises) the same result. Background work uses its own gloo group; the main thread's
agreements (staging id, restore choice, time-based decisions) use another, so the two never interleave.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import time
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict

import trainguard
from trainguard.checkpoint.checksum import available, default_algorithm, file_checksum, new_hasher
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.interval import IntervalPolicy
from trainguard.checkpoint.lock import DirectoryLock, acquire, current_owner
from trainguard.checkpoint.manifest import (
    FileEntry,
    Manifest,
    commit,
    committed_steps,
    latest_step,
    read_manifest,
    require_loadable,
    step_dir,
    structure_mismatch,
    verify_files,
    write_manifest,
)
from trainguard.checkpoint.retention import apply_retention
from trainguard.checkpoint.safefs import make_dirs
from trainguard.checkpoint.structure import (
    RANK_LOCAL_KEY,
    RANK_LOCAL_STORED,
    assign,
    describe,
    saved_structure,
    tensor_bytes,
)
from trainguard.checkpoint.writer import CachingStager, ChecksumWriter, WriteHooks
from trainguard.eventlog import EventWriter
from trainguard.events import (
    CheckpointLoaded,
    CheckpointPolicyChanged,
    CheckpointRejected,
    CheckpointSaveFinished,
    CheckpointSaveStarted,
    Event,
)

log = logging.getLogger(__name__)
# Single-process use (no process group) is intended, not a mistake worth a warning per save.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


@dataclass
class _Pending:
    step: int
    future: Future[tuple[bool, str]]
    blocking_seconds: float
    """Time ``save()`` held training for this save (the later wait for it is added on drain)."""


def _describe_error(exc: BaseException) -> str:
    """One line naming the root cause (DCP wraps per-rank failures in a CheckpointException)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, inner = min(failures.items())
        inner_exc = inner[0] if isinstance(inner, tuple) else inner
        return f"rank {rank}: {_describe_error(inner_exc) if isinstance(inner_exc, BaseException) else inner_exc}"
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0] if text else ''}".strip()


_FULL_DISK_BYTES = 1 << 20


def _disk_full_hint(path: Path) -> str:
    """Torch's writer can turn ENOSPC into an opaque error ("unexpected pos ..."); say when the disk is full."""
    try:
        st = os.statvfs(path)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free >= _FULL_DISK_BYTES:
        return ""
    return f" (No space left on device: {free} bytes free on the checkpoint file system)"


class Checkpointer:
    """Saves and restores training state in ``directory`` (see module doc and docs/checkpoint.md)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        events: EventWriter | None = None,
        attempt: int = 0,
        process_group: Any = None,
        async_save: bool = True,
        keep_last: int = 3,
        keep_every: int | None = None,
        interval: IntervalPolicy | None = None,
        timeout_seconds: float = 600.0,
        hooks: WriteHooks | None = None,
        checksum: str | None = None,
    ) -> None:
        if keep_last < 1 or (keep_every is not None and keep_every < 1):
            raise ValueError("keep_last must be >= 1 and keep_every None or >= 1")
        if async_save and process_group is not None and process_group is dist.GroupMember.WORLD:
            raise ValueError("async checkpoints need their own gloo group, not the default one (it hangs)")
        self.directory = Path(directory)
        self.events = events
        self.attempt = attempt
        self.async_save = async_save
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.interval = interval or IntervalPolicy.every_steps(100)
        self.timeout_seconds = timeout_seconds
        self.hooks = hooks
        self.checksum = checksum or default_algorithm()
        new_hasher(self.checksum)  # ValueError now for an unavailable algorithm
        self._host = os.environ.get("TRAINGUARD_NODE") or socket.gethostname()  # the agent's node id
        self._save_pg = process_group
        self._ctl_pg: Any = None
        self._groups_ready = False
        self._stager = CachingStager()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: _Pending | None = None
        self._error: str | None = None
        self._protected: int | None = None
        self._last_save_step: int | None = None
        self._last_save_time = time.monotonic()
        self._closed = False
        self._token = secrets.token_hex(4) + "-"
        """Rank 0's random prefix of staging directory names, agreed once when the groups are set up."""
        self._saves = 0
        self._lock: DirectoryLock | None = None
        """Rank 0's hold on the directory (one job per directory), released by `close`."""
        if dist.is_available() and dist.is_initialized():
            self._setup_groups()
        else:
            self._own_directory()
        self._emit_policy(self.interval)

    # --- process groups ------------------------------------------------------------------------
    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    @property
    def rank(self) -> int:
        return dist.get_rank() if self.distributed else 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if self.distributed else 1

    def _setup_groups(self) -> None:
        if self._groups_ready or not self.distributed:
            return
        timeout = timedelta(seconds=self.timeout_seconds)
        if self._save_pg is None:
            self._save_pg = dist.new_group(backend="gloo", timeout=timeout)
        self._ctl_pg = dist.new_group(backend="gloo", timeout=timeout)
        error = ""
        if self.rank == 0 and self._lock is None:
            try:
                self._own_directory()
            except CheckpointError as exc:
                error = str(exc)
        elif self.rank != 0 and self._lock is not None:  # taken before the process group existed
            self._lock.release()
            self._lock = None
        # One broadcast carries the staging token and the ownership outcome: every rank raises alike.
        self._token, error = self._broadcast((self._token, error), self._ctl_pg)
        self._groups_ready = True
        if error:
            self._closed = True
            raise CheckpointError(error)

    def _own_directory(self) -> None:
        """Take the directory for this job (rank 0 only); `CheckpointError` naming the job that holds it."""
        self._lock = acquire(self.directory, current_owner())
        weakref.finalize(self, self._lock.release)  # a Checkpointer dropped without close()

    def _broadcast(self, obj: Any, group: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=group)
        return box[0]

    def _all_gather(self, obj: Any, group: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=group)
        return out

    # --- events ----------------------------------------------------------------------------------
    def _emit(self, record: Event) -> None:
        if self.events is None:
            return
        try:
            self.events.write(record)
        except trainguard.TrainguardError as exc:
            log.warning("cannot record checkpoint event: %s", exc)

    def _emit_policy(self, policy: IntervalPolicy) -> None:
        if self.rank == 0:
            self._emit(
                CheckpointPolicyChanged(
                    time=time.time(),
                    host=self._host,
                    policy=policy.policy,
                    interval_seconds=policy.seconds,
                    interval_steps=policy.steps,
                    save_cost_seconds=policy.save_cost_seconds if policy.time_based else None,
                    mtbf_seconds=policy.mtbf_seconds,
                )
            )

    # --- interval policy --------------------------------------------------------------------------
    def should_save(self, step: int) -> bool:
        """Whether ``step`` is due for a checkpoint; time-based policies use rank 0's clock for all."""
        if self.interval.policy == "steps":
            return self.interval.due(step, self._last_save_step, 0.0)
        self._setup_groups()
        due = self.interval.due(step, self._last_save_step, time.monotonic() - self._last_save_time)
        return bool(self._broadcast(due, self._ctl_pg))

    def set_mtbf(self, mtbf_seconds: float) -> None:
        """Feed a configured or observed mean time between failures to an ``auto`` policy."""
        new = self.interval.with_measurements(mtbf_seconds=mtbf_seconds)
        if new is not None:
            self.interval = new
            self._emit_policy(new)

    def _measured_cost(self, blocking_seconds: float) -> None:
        new = self.interval.with_measurements(save_cost_seconds=blocking_seconds)
        if new is not None:
            self.interval = new
            self._emit_policy(new)

    # --- save ----------------------------------------------------------------------------------------
    def save(self, step: int, state: dict[str, Any]) -> None:
        """Save ``state`` as step ``step``; returns once it is staged (async) or committed (sync).

        Raises `CheckpointError` first if the previous background save failed (the error is reported
        once; the call after that saves normally).
        """
        if self._closed:
            raise CheckpointError("checkpointer is closed")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        start_wall, start = time.time(), time.perf_counter()
        self._drain()
        self._raise_error()
        self._setup_groups()
        self._saves += 1
        nonce = f"{self._token}{self._saves}"  # same on every rank, unique to this job: no collective
        make_dirs(self.directory)
        staging = self.directory / f".staging-step-{step}-{nonce}"
        payload = {k: v for k, v in state.items() if k != RANK_LOCAL_KEY}
        if RANK_LOCAL_KEY in state:
            payload[RANK_LOCAL_STORED] = {str(self.rank): state[RANK_LOCAL_KEY]}
        self._emit(
            CheckpointSaveStarted(time=start_wall, host=self._host, attempt=self.attempt, rank=self.rank, step=step)
        )
        writer = ChecksumWriter(staging, algorithm=self.checksum, hooks=self.hooks)
        self._last_save_step, self._last_save_time = step, time.monotonic()
        try:
            if self.async_save:
                upload = dcp.async_save(
                    payload,
                    storage_writer=writer,
                    process_group=self._save_pg,
                    async_stager=self._stager,
                    no_dist=not self.distributed,
                )
            else:
                upload = Future()
                try:
                    upload.set_result(
                        dcp.save(
                            payload, storage_writer=writer, process_group=self._save_pg, no_dist=not self.distributed
                        )
                    )
                except BaseException as exc:  # the writer's error, agreed across ranks by DCP
                    upload.set_exception(exc)
        except Exception as exc:
            raise CheckpointError(f"checkpoint of step {step} could not be staged: {exc}") from exc
        blocking = time.perf_counter() - start
        args = (upload, writer, staging, step, start, blocking)
        if self.async_save:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="trainguard-checkpoint")
            self._pending = _Pending(step, self._executor.submit(self._finish, *args), blocking)
        else:
            ok, error = self._finish(*args)
            self._consume(step, ok, error, blocking)
            self._raise_error()

    def _finish(
        self,
        upload: Future[Any],
        writer: ChecksumWriter,
        staging: Path,
        step: int,
        start: float,
        blocking: float,
    ) -> tuple[bool, str]:
        """Wait for the shards, agree, commit on rank 0, agree on the outcome, emit the event."""
        error = ""
        metadata = None
        try:
            metadata = upload.result()
        except BaseException as exc:  # DCP's CheckpointException derives from BaseException
            error = _describe_error(exc)
            if "No space left" not in error:
                error += _disk_full_hint(staging)
        written = time.perf_counter()
        try:
            reports = self._all_gather((error, dict(writer.files)), self._save_pg)
            if self.rank == 0:
                bad = [(r, e) for r, (e, _) in enumerate(reports) if e]
                if bad:
                    rank, first = bad[0]
                    error = first if first.startswith("rank ") else f"rank {rank}: {first}"
                else:
                    error = self._commit(staging, step, reports, metadata)
                if error:
                    shutil.rmtree(staging, ignore_errors=True)
            error = self._broadcast(error, self._save_pg)
        except Exception as exc:  # a dead peer (group timeout) or a broken connection
            error = error or f"checkpoint group failed ({exc.__class__.__name__}: {exc})"
        ok = not error
        mine = sum(size for size, _ in writer.files.values())
        log.debug(
            "checkpoint step %d: blocking %.3fs, shards written %.3fs, agreement and commit %.3fs",
            step,
            blocking,
            written - start,
            time.perf_counter() - written,
        )
        self._emit(
            CheckpointSaveFinished(
                time=time.time(),
                host=self._host,
                attempt=self.attempt,
                rank=self.rank,
                step=step,
                blocking_seconds=blocking,
                total_seconds=time.perf_counter() - start,
                bytes=mine,
                path=str(step_dir(self.directory, step)) if ok else str(staging),
                ok=ok,
                error=error,
            )
        )
        if not ok:
            log.error("checkpoint of step %d failed: %s", step, error)
        return ok, error

    def _commit(self, staging: Path, step: int, reports: list[Any], metadata: Any) -> str:
        """Rank 0: write the manifest, rename into place, apply retention. Returns an error or ''."""
        try:
            files: dict[str, FileEntry] = {}
            for _, rank_files in reports:
                for name, (size, digest) in rank_files.items():
                    files[name] = FileEntry(size=size, checksum=digest)
            for name in os.listdir(staging):  # anything not streamed through a checksumming writer
                if name not in files:
                    size, digest = file_checksum(staging / name, self.checksum)
                    files[name] = FileEntry(size=size, checksum=digest)
            manifest = Manifest(
                step=step,
                world_size=self.world_size,
                files=files,
                checksum_algorithm=self.checksum,
                time=time.time(),
                structure=saved_structure(metadata) if metadata is not None else {},
                trainguard_version=trainguard.__version__,
                torch_version=torch.__version__,
            )
            write_manifest(staging, manifest)
            if self.hooks is not None:
                self.hooks.before_commit(staging, step)
            commit(staging, step_dir(self.directory, step))
        except Exception as exc:  # ENOSPC/EACCES on the manifest, or anything else: never skip the broadcast
            return f"commit failed: {exc.__class__.__name__}: {exc}"
        self._protected = step
        try:
            apply_retention(self.directory, keep_last=self.keep_last, keep_every=self.keep_every, protect=[step])
        except (OSError, ValueError) as exc:
            log.warning("retention pass failed (nothing valid was removed): %s", exc)
        return ""

    def _drain(self) -> None:
        """Wait for the pending background save and record its outcome."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        start = time.perf_counter()
        try:
            ok, error = pending.future.result()
        except Exception as exc:  # a bug in the background path: report it like a failed save
            ok, error = False, f"{exc.__class__.__name__}: {exc}"
        # The cost of a checkpoint to training: the staging stall plus any wait for it to finish.
        self._consume(pending.step, ok, error, pending.blocking_seconds + time.perf_counter() - start)

    def _consume(self, step: int, ok: bool, error: str, blocking_seconds: float) -> None:
        if ok:
            self._protected = step
            if self.interval.time_based and blocking_seconds > 0:
                self._measured_cost(blocking_seconds)
        else:
            self._error = f"checkpoint of step {step} failed: {error}"

    def _raise_error(self) -> None:
        if self._error:
            message, self._error = self._error, None
            raise CheckpointError(message)

    def wait(self) -> None:
        """Finish the pending async save; raises `CheckpointError` if it (or an earlier one) failed."""
        self._drain()
        self._raise_error()

    def close(self) -> None:
        """Finish the pending save and release the worker thread; raises like `wait`."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            self._stager.close()
            if self._lock is not None:
                self._lock.release()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- restore -------------------------------------------------------------------------------------
    def latest_step(self) -> int | None:
        """Newest committed checkpoint whose manifest and file sizes check out (no process group needed)."""
        return latest_step(self.directory)

    def restore(self, state: dict[str, Any]) -> int | None:
        """Load the newest verified checkpoint into ``state`` in place; its step, or None if there is none.

        Corrupt or partial checkpoints are reported (`CheckpointRejected`), moved aside to
        ``.rejected-step-N-*`` and skipped. Raises `CheckpointError` when checkpoints exist but none
        matches the structure of ``state`` (a wrong model or an uninitialised optimizer state).
        """
        self._drain()
        self._setup_groups()
        start = time.perf_counter()
        payload = {k: v for k, v in state.items() if k != RANK_LOCAL_KEY}
        if RANK_LOCAL_KEY in state:
            payload[RANK_LOCAL_STORED] = {str(self.rank): state[RANK_LOCAL_KEY]}
        flat, mapping = flatten_state_dict(payload)
        wanted = describe(flat)
        own = f"{RANK_LOCAL_STORED}.{self.rank}"
        steps: list[int] = self._broadcast(self._candidates(), self._ctl_pg)
        mismatches: list[str] = []
        for step in steps:
            path = step_dir(self.directory, step)
            reason, kind = self._check(path, wanted, own)
            reasons = self._all_gather((reason, kind), self._ctl_pg)
            if not any(r for r, _ in reasons):
                load_error = ""
                try:
                    dcp.load(flat, checkpoint_id=str(path), process_group=self._ctl_pg, no_dist=not self.distributed)
                    self._write_back(payload, flat, mapping, state)
                except BaseException as exc:  # DCP's CheckpointException derives from BaseException
                    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                        raise
                    load_error = f"load failed: {_describe_error(exc)}"
                # DCP agrees on its own errors; this makes every other failure (write-back) agreed too.
                reasons = [(e, "corrupt" if e else "") for e in self._all_gather(load_error, self._ctl_pg)]
                if not any(r for r, _ in reasons):
                    self._loaded(step, path, start, tensor_bytes(flat))
                    return step
            rank, (reason, kind) = next((r, x) for r, x in enumerate(reasons) if x[0])
            self._reject(step, path, f"rank {rank}: {reason}", kind)
            if kind in ("structure", "unverifiable"):
                mismatches.append(f"step {step}: {reason}")
        if mismatches:
            raise CheckpointError(f"no checkpoint in {self.directory} matches the state: {mismatches[0]}")
        return None

    def _candidates(self) -> list[int]:
        """Rank 0's list of committed steps, newest first; an unreadable directory lists none."""
        if self.rank != 0:
            return []
        try:
            return committed_steps(self.directory)
        except OSError as exc:
            log.warning("cannot list checkpoints in %s: %s", self.directory, exc)
            return []

    def _check(self, path: Path, wanted: dict[str, Any], own: str) -> tuple[str, str]:
        """(reason, kind) why this rank cannot use ``path``, ``("", "")`` when its share verifies.

        Never raises: whatever goes wrong reading a checkpoint makes it corrupt on this rank, and the
        all-gather that follows makes that the verdict of every rank.
        """
        try:
            return self._check_unsafe(path, wanted, own)
        except CheckpointError as exc:
            return str(exc), "corrupt"
        except Exception as exc:
            return f"unreadable ({exc.__class__.__name__}: {str(exc)[:200]})", "corrupt"

    def _check_unsafe(self, path: Path, wanted: dict[str, Any], own: str) -> tuple[str, str]:
        manifest = read_manifest(path)
        require_loadable(manifest)
        saved = {
            k: v
            for k, v in manifest.structure.items()
            if not k.startswith(RANK_LOCAL_STORED) or k == own or k.startswith(own + ".")
        }
        if manifest.checksum_algorithm not in available():
            return (
                f"checksum {manifest.checksum_algorithm} cannot be verified here (pip install xxhash)",
                "unverifiable",
            )
        problem = structure_mismatch(saved, wanted)
        if not problem and manifest.world_size != self.world_size and any(k.startswith(own) for k in wanted):
            problem = f"rank-local state was saved by {manifest.world_size} ranks, this job has {self.world_size}"
        if problem:
            return problem, "structure"
        verify_files(path, manifest, sorted(manifest.files)[self.rank :: self.world_size])
        return "", ""

    def _reject(self, step: int, path: Path, reason: str, kind: str) -> None:
        log.warning("checkpoint %s rejected: %s", path, reason)
        if self.rank != 0:
            return
        self._emit(
            CheckpointRejected(
                time=time.time(), host=self._host, attempt=self.attempt, step=step, path=str(path), reason=reason
            )
        )
        if kind == "corrupt":  # a structure mismatch or an unverifiable checksum is no proof of damage
            try:
                os.rename(path, self.directory / f".rejected-step-{step}-{secrets.token_hex(4)}")
            except OSError as exc:
                log.warning("cannot move rejected checkpoint %s aside: %s", path, exc)

    def _write_back(self, payload: dict[str, Any], flat: dict[str, Any], mapping: Any, state: dict[str, Any]) -> None:
        for fqn, value in flat.items():
            if not isinstance(value, torch.Tensor):
                assign(payload, tuple(mapping[fqn]), value)
        for key in state:
            if key == RANK_LOCAL_KEY:
                state[key] = payload[RANK_LOCAL_STORED][str(self.rank)]
            else:
                state[key] = payload[key]

    def _loaded(self, step: int, path: Path, start: float, nbytes: int) -> None:
        self._protected = step
        self._last_save_step, self._last_save_time = step, time.monotonic()
        self._emit(
            CheckpointLoaded(
                time=time.time(),
                host=self._host,
                attempt=self.attempt,
                rank=self.rank,
                step=step,
                seconds=time.perf_counter() - start,
                path=str(path),
                bytes=nbytes,
            )
        )
