"""`Checkpointer`: sharded DCP saves with atomic commit, one-read verified restore with fallback, async saves.

Protocol (details in docs/checkpoint.md): every rank writes its shard into ``.staging-step-N-<id>/``
while checksumming it; rank 0 commits (`trainguard.checkpoint.saving`). Restore loads the newest
checkpoint through a reader that verifies what it reads (`trainguard.checkpoint.restore`). Built with
a `trainguard.Worker`, the checkpointer writes the worker's events and marks its own work as the
``checkpoint`` phase, which the agent's hang detection allows extra time for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import socket
import time
import warnings
import weakref
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from trainguard.checkpoint.checksum import default_algorithm
from trainguard.checkpoint.config import CheckpointConfig
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.groups import Collectives
from trainguard.checkpoint.interval import IntervalPolicy
from trainguard.checkpoint.lock import DirectoryLock, acquire, current_owner
from trainguard.checkpoint.manifest import committed_steps, latest_step
from trainguard.checkpoint.memory_tier import MemoryRestore, MemoryTier
from trainguard.checkpoint.restore import Restorer, to_payload
from trainguard.checkpoint.safefs import make_dirs
from trainguard.checkpoint.saving import Committer, SaveJob
from trainguard.checkpoint.staging import StagingArena
from trainguard.checkpoint.writer import CachingStager, ChecksumWriter, WriteHooks
from trainguard.core.eventlog import EventWriter
from trainguard.core.events import CheckpointPolicyChanged, CheckpointSaveStarted, Event
from trainguard.core.protocol import MEMORY_GB_ENV, MEMORY_PLACEMENT_ENV
from trainguard.errors import TrainguardError
from trainguard.worker import ckpt_io
from trainguard.worker.library import Worker

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

log = logging.getLogger(__name__)

_SINGLE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


@contextlib.contextmanager
def _quiet_single_process(distributed: bool) -> Iterator[None]:
    """Single-process use (no process group) is intended: hide DCP's warning about it, for this call only."""
    if distributed:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
        yield


@dataclass
class _Pending:
    step: int
    future: Future[tuple[bool, str]]
    blocking_seconds: float
    """Time ``save()`` held training for this save (the later wait for it is added on drain)."""


class Checkpointer:
    """Saves and restores training state (see module doc and docs/checkpoint.md).

    ``Checkpointer(worker, config)`` takes events, attempt number, the directory default
    (``<run dir>/checkpoints``) and the ``checkpoint`` phase from ``worker``; ``Checkpointer(directory,
    config)`` works without one (``events``/``attempt`` may then be given). ``process_group`` is the
    group background saves use (default: a new gloo group); ``hooks`` is the fault-injection seam.
    """

    def __init__(
        self,
        target: Worker | str | os.PathLike[str],
        config: CheckpointConfig | None = None,
        *,
        events: EventWriter | None = None,
        attempt: int | None = None,
        process_group: ProcessGroup | None = None,
        hooks: WriteHooks | None = None,
    ) -> None:
        config = config or CheckpointConfig()
        if not isinstance(config, CheckpointConfig):
            raise ValueError(f"config must be a CheckpointConfig, got {type(config).__name__}")
        config = _with_launcher_memory_tier(config)
        self._worker = target if isinstance(target, Worker) else None
        self.directory = _directory(target, config)
        if config.async_save and process_group is not None and process_group is dist.GroupMember.WORLD:
            raise ValueError("async checkpoints need their own gloo group, not the default one (it hangs)")
        self.config = config
        self.events = events if events is not None or self._worker is None else self._worker.events
        self.attempt = attempt if attempt is not None else (self._worker.attempt if self._worker else 0)
        self.interval = config.interval
        self.hooks = hooks
        self.checksum = config.checksum or default_algorithm()
        self._host = os.environ.get("TRAINGUARD_NODE") or socket.gethostname()  # the agent's node id
        self._comm = Collectives(process_group, config.timeout_seconds)
        self._stager = CachingStager()
        self._arena = StagingArena()
        """Host memory restores load into before they are verified, kept for the next restore."""
        self._executor: ThreadPoolExecutor | None = None
        self._pending: _Pending | None = None
        self._error: str | None = None
        self._last_save_step: int | None = None
        self._last_save_time = time.monotonic()
        self._closed = False
        self._token = secrets.token_hex(4) + "-"
        """Rank 0's random prefix of staging directory names, agreed once when the groups are set up."""
        self._saves = 0
        self._lock: DirectoryLock | None = None
        """Rank 0's hold on the directory (one job per directory), released by `close`."""
        self._committer = Committer(
            self.directory, self._comm, algorithm=self.checksum, hooks=hooks, keep_last=config.keep_last,
            keep_every=config.keep_every, emit=self._emit, host=self._host, attempt=self.attempt,
        )
        if self._comm.distributed:
            self._setup_groups()
        else:
            self._own_directory()
        self.memory: MemoryTier | None = None
        """The memory tier (``config.memory_gb`` set), else None."""
        if config.memory_gb is not None:
            secret_dir = Path(self._worker.run_dir) if self._worker is not None else self.directory
            make_dirs(secret_dir)
            self.memory = MemoryTier(
                config, self.directory, secret_dir, self._comm, self._host, self._emit, self.attempt, hooks,
            )
        self.last_restore: MemoryRestore | None = None
        """What the last `restore` loaded from memory (None: it used storage or found nothing)."""
        self.last_restore_storage_bytes = 0
        """Bytes the last `restore` read from checkpoint files in storage (0 when memory served it)."""
        self._emit_policy(self.interval)

    # --- process groups ------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def world_size(self) -> int:
        return self._comm.world_size

    def _setup_groups(self) -> None:
        if not self._comm.create():
            return
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
        self._token, error = self._comm.broadcast((self._token, error), self._comm.ctl_pg)
        if error:
            self._closed = True
            raise CheckpointError(error)

    def _own_directory(self) -> None:
        """Take the directory for this job (rank 0 only); `CheckpointError` naming the job that holds it."""
        self._lock = acquire(self.directory, current_owner())
        weakref.finalize(self, self._lock.release)  # a Checkpointer dropped without close()

    def _newest_committed(self) -> int | None:
        """Storage's newest committed step, from directory names alone (no file read)."""
        return next(iter(committed_steps(self.directory)), None)

    def _phase(self) -> contextlib.AbstractContextManager[None]:
        """The worker's ``checkpoint`` phase (the agent allows it extra time), or nothing without a worker."""
        return self._worker.phase("checkpoint") if self._worker is not None else contextlib.nullcontext()

    # --- events ----------------------------------------------------------------------------------
    def _emit(self, record: Event) -> None:
        if self.events is None:
            return
        try:
            self.events.write(record)
        except TrainguardError as exc:
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
        return bool(self._comm.broadcast(due, self._comm.ctl_pg))

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
        with self._phase():
            start_wall, start = time.time(), time.perf_counter()
            self._drain()
            self._raise_error()
            self._setup_groups()
            self._saves += 1
            nonce = f"{self._token}{self._saves}"  # same on every rank, unique to this job: no collective
            make_dirs(self.directory)
            staging = self.directory / f".staging-step-{step}-{nonce}"
            payload = to_payload(state, self.rank)
            self._emit(
                CheckpointSaveStarted(time=start_wall, host=self._host, attempt=self.attempt, rank=self.rank, step=step)
            )
            writer = ChecksumWriter(staging, algorithm=self.checksum, hooks=self.hooks)
            self._last_save_step, self._last_save_time = step, time.monotonic()
            upload = self._start_upload(step, payload, writer)
            job = SaveJob(upload, writer, staging, step, start, time.perf_counter() - start)
            if self.config.async_save:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="trainguard-checkpoint")
                self._pending = _Pending(step, self._executor.submit(self._committer.finish, job), job.blocking_seconds)
            else:
                ok, error = self._committer.finish(job)
                self._consume(step, ok, error, job.blocking_seconds)
                self._raise_error()
        if self.memory is not None:
            self.save_to_memory(step, state)

    def should_save_to_memory(self, step: int) -> bool:
        """Whether ``step`` is due for a memory-tier copy (``config.memory_every_steps``)."""
        every = self.config.memory_every_steps
        return self.memory is not None and every is not None and step % every == 0

    def save_to_memory(self, step: int, state: dict[str, Any]) -> None:
        """Copy ``state`` to the memory tier only (its node's holder, then a peer's in the background).

        Every rank calls it at the same steps. Raises `CheckpointError` when the tier is off, when the
        copy does not fit ``config.memory_gb``, or when the previous copy's replica failed.
        """
        if self.memory is None:
            raise CheckpointError("the memory tier is off (set CheckpointConfig.memory_gb)")
        if self._closed:
            raise CheckpointError("checkpointer is closed")
        with self._phase():
            self._setup_groups()
            self.memory.save(step, state)

    def _start_upload(self, step: int, payload: dict[str, Any], writer: ChecksumWriter) -> Future[Any]:
        """Hand the state to DCP: staged and uploading in the background (async), or written (sync)."""
        single = not self._comm.distributed
        try:
            # ckpt_io.quiet: this save is reported by the checkpointer's own records, not again as a DCP call
            with _quiet_single_process(not single), ckpt_io.quiet():
                if self.config.async_save:
                    upload: Future[Any] = dcp.async_save(
                        payload, storage_writer=writer, process_group=self._comm.save_pg,
                        async_stager=self._stager, no_dist=single,
                    )
                    return upload
                done: Future[Any] = Future()
                try:
                    done.set_result(dcp.save(payload, storage_writer=writer, process_group=self._comm.save_pg,
                                             no_dist=single))
                except BaseException as exc:  # the writer's error, agreed across ranks by DCP
                    done.set_exception(exc)
                return done
        except Exception as exc:
            raise CheckpointError(f"checkpoint of step {step} could not be staged: {exc}") from exc

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
        with self._phase():
            self._drain()
            if self.memory is not None:
                self.memory.drain()
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
            if self.memory is not None:
                self.memory.close()
            self._stager.close()
            self._arena.release()
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

        With the memory tier on, the newest copy every rank holds in memory (own node, then a peer's
        replica) is loaded instead when it is at least as new as storage's newest (see `MemoryTier`).
        Every file is read once and checked against the manifest's checksum while it loads: straight into
        ``state``'s tensors when an older checkpoint is left to fall back on (a failed verification loads
        that one over it), else into host memory, copied into ``state`` only once every rank's files
        verified. Corrupt or partial checkpoints are reported (`CheckpointRejected`), moved aside to
        ``.rejected-step-N-*`` and skipped. Raises `CheckpointError` when checkpoints exist but none matches
        the structure of ``state`` (a wrong model or an uninitialised optimizer state), or when none
        verified after one had been loaded in place (``state`` then holds rejected bytes).
        """
        with self._phase():
            self._drain()
            self._setup_groups()
            self.last_restore, self.last_restore_storage_bytes = None, 0
            if self.memory is not None:
                # Names only (no file read): memory serves unless storage holds a newer checkpoint. Rank 0
                # lists them; its answer travels with the memory tier's own agreement (no collective of its own).
                self.last_restore = self.memory.restore(state, self._newest_committed)
                if self.last_restore is not None:
                    self._last_save_step, self._last_save_time = self.last_restore.step, time.monotonic()
                    return self.last_restore.step
            restorer = Restorer(self.directory, self._comm, self._emit, self._host, self.attempt, self._arena)
            with _quiet_single_process(self._comm.distributed):
                restored = restorer.restore(state)
        if restored is None:
            return None
        self.last_restore_storage_bytes = restored.read_bytes
        self._last_save_step, self._last_save_time = restored.step, time.monotonic()
        return restored.step


def _directory(target: Worker | str | os.PathLike[str], config: CheckpointConfig) -> Path:
    """Where checkpoints go: the config's directory, else the path given, else the worker's run directory."""
    if isinstance(target, Worker):
        if config.directory is not None:
            return Path(config.directory)
        return Path(target.run_dir) / "checkpoints"
    if isinstance(target, (str, os.PathLike)):
        if config.directory is not None and Path(config.directory) != Path(target):
            raise ValueError(f"two checkpoint directories: {os.fspath(target)!r} and CheckpointConfig.directory")
        return Path(target)
    raise ValueError(f"Checkpointer needs a trainguard.Worker or a directory, got {type(target).__name__}")


def _with_launcher_memory_tier(config: CheckpointConfig) -> CheckpointConfig:
    """``config`` with the launcher's memory bound and placement where the script left them unset."""
    placement = os.environ.get(MEMORY_PLACEMENT_ENV, "")
    if config.memory_placement is None and placement:
        try:
            config = dataclasses.replace(config, memory_placement=placement)
        except ValueError as exc:
            log.warning("ignoring %s: %s", MEMORY_PLACEMENT_ENV, exc)
    raw = os.environ.get(MEMORY_GB_ENV, "")
    if config.memory_gb is not None or not raw:
        return config
    try:
        gb = float(raw)
    except ValueError:
        log.warning("ignoring %s=%r: not a number", MEMORY_GB_ENV, raw[:40])
        return config
    return dataclasses.replace(config, memory_gb=gb) if gb > 0 else config

