"""The background half of a save: wait for the shards, agree across ranks, commit on rank 0, report.

Every rank hands its written files' sizes and checksums to rank 0, which writes ``manifest.json``,
renames the staging directory to ``step-N/``, fsyncs the parent and applies retention; the outcome
is broadcast so every rank reports (and later raises) the same result.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainguard.checkpoint.checksum import file_checksum
from trainguard.checkpoint.groups import Collectives
from trainguard.checkpoint.manifest import FileEntry, Manifest, commit, step_dir, write_manifest
from trainguard.checkpoint.retention import apply_retention
from trainguard.checkpoint.structure import saved_structure
from trainguard.checkpoint.writer import ChecksumWriter, WriteHooks
from trainguard.core.events import CheckpointSaveFinished, Event

log = logging.getLogger(__name__)

_FULL_DISK_BYTES = 1 << 20


def describe_error(exc: BaseException) -> str:
    """One line naming the root cause (DCP wraps per-rank failures in a CheckpointException)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, inner = min(failures.items())
        inner_exc = inner[0] if isinstance(inner, tuple) else inner
        return f"rank {rank}: {describe_error(inner_exc) if isinstance(inner_exc, BaseException) else inner_exc}"
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0] if text else ''}".strip()


def disk_full_hint(path: Path) -> str:
    """Torch's writer can turn ENOSPC into an opaque error ("unexpected pos ..."); say when the disk is full."""
    try:
        st = os.statvfs(path)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free >= _FULL_DISK_BYTES:
        return ""
    return f" (No space left on device: {free} bytes free on the checkpoint file system)"


@dataclass(frozen=True)
class SaveJob:
    """One save in flight, as `Committer.finish` needs it."""

    upload: Future[Any]
    """DCP's future of the shards (its result is DCP's global metadata)."""
    writer: ChecksumWriter
    """The storage writer, holding this rank's ``{file: (size, checksum)}``."""
    staging: Path
    """The staging directory the shards go to."""
    step: int
    """Step being saved."""
    start: float
    """``time.perf_counter()`` when `save` was called."""
    blocking_seconds: float
    """Time `save` held training."""


class Committer:
    """Finishes saves for one checkpointer (rank 0 commits, every rank reports the agreed outcome)."""

    def __init__(
        self, directory: Path, comm: Collectives, *, algorithm: str, hooks: WriteHooks | None, keep_last: int,
        keep_every: int | None, emit: Callable[[Event], None], host: str, attempt: int,
    ) -> None:
        self.directory = directory
        self.comm = comm
        self.algorithm = algorithm
        self.hooks = hooks
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.emit = emit
        self.host = host
        self.attempt = attempt

    def finish(self, job: SaveJob) -> tuple[bool, str]:
        """Wait for the shards, agree, commit on rank 0, agree on the outcome, emit the event."""
        error = ""
        metadata = None
        try:
            metadata = job.upload.result()
        except BaseException as exc:  # DCP's CheckpointException derives from BaseException
            error = describe_error(exc)
            if "No space left" not in error:
                error += disk_full_hint(job.staging)
        written = time.perf_counter()
        comm = self.comm
        try:
            reports = comm.all_gather((error, dict(job.writer.files)), comm.save_pg)
            if comm.rank == 0:
                bad = [(r, e) for r, (e, _) in enumerate(reports) if e]
                if bad:
                    rank, first = bad[0]
                    error = first if first.startswith("rank ") else f"rank {rank}: {first}"
                else:
                    error = self._commit(job.staging, job.step, reports, metadata)
                if error:
                    shutil.rmtree(job.staging, ignore_errors=True)
            error = comm.broadcast(error, comm.save_pg)
        except Exception as exc:  # a dead peer (group timeout) or a broken connection
            error = error or f"checkpoint group failed ({exc.__class__.__name__}: {exc})"
        self._report(job, error, written)
        return not error, error

    def _report(self, job: SaveJob, error: str, written: float) -> None:
        ok = not error
        log.debug(
            "checkpoint step %d: blocking %.3fs, shards written %.3fs, agreement and commit %.3fs",
            job.step,
            job.blocking_seconds,
            written - job.start,
            time.perf_counter() - written,
        )
        self.emit(
            CheckpointSaveFinished(
                time=time.time(),
                host=self.host,
                attempt=self.attempt,
                rank=self.comm.rank,
                step=job.step,
                blocking_seconds=job.blocking_seconds,
                total_seconds=time.perf_counter() - job.start,
                bytes=sum(size for size, _ in job.writer.files.values()),
                path=str(step_dir(self.directory, job.step)) if ok else str(job.staging),
                ok=ok,
                error=error,
            )
        )
        if not ok:
            log.error("checkpoint of step %d failed: %s", job.step, error)

    def _commit(self, staging: Path, step: int, reports: list[Any], metadata: Any) -> str:
        """Rank 0: write the manifest, rename into place, apply retention. Returns an error or ''."""
        try:
            files: dict[str, FileEntry] = {}
            for _, rank_files in reports:
                for name, (size, digest) in rank_files.items():
                    files[name] = FileEntry(size=size, checksum=digest)
            for name in os.listdir(staging):  # anything not streamed through a checksumming writer
                if name not in files:
                    size, digest = file_checksum(staging / name, self.algorithm)
                    files[name] = FileEntry(size=size, checksum=digest)
            manifest = Manifest(
                step=step,
                world_size=self.comm.world_size,
                files=files,
                checksum_algorithm=self.algorithm,
                time=time.time(),
                structure=saved_structure(metadata) if metadata is not None else {},
                trainguard_version=_version(),
                torch_version=torch.__version__,
            )
            write_manifest(staging, manifest)
            if self.hooks is not None:
                self.hooks.before_commit(staging, step)
            commit(staging, step_dir(self.directory, step))
        except Exception as exc:  # ENOSPC/EACCES on the manifest, or anything else: never skip the broadcast
            return f"commit failed: {exc.__class__.__name__}: {exc}"
        try:
            apply_retention(self.directory, keep_last=self.keep_last, keep_every=self.keep_every, protect=[step])
        except (OSError, ValueError) as exc:
            log.warning("retention pass failed (nothing valid was removed): %s", exc)
        return ""


def _version() -> str:
    # the package root is imported at call time, not with this module: the root loads checkpoint/ lazily
    from trainguard import __version__

    return __version__
