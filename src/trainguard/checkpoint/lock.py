"""Ownership of a checkpoint directory: one job at a time, by an ``flock`` on ``<dir>/.trainguard.lock``.

Two jobs writing one directory destroy each other's work (one's retention removes the other's
staging directory mid-save). The kernel drops an ``flock`` when its holder dies, so a crashed job
never leaves a stale lock behind and its restarted attempt takes the directory again at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.safefs import FILE_MODE, make_dirs, read_capped

log = logging.getLogger(__name__)

LOCK_NAME = ".trainguard.lock"
_MAX_OWNER_BYTES = 4096
_POLL_SECONDS = 0.1


@dataclass(frozen=True)
class Owner:
    """Who holds a checkpoint directory (written into the lock file for the refused job's message)."""

    run_id: str
    """The job's id (``TORCHELASTIC_RUN_ID``), shared by all its ranks and attempts; ``""`` when unknown."""
    host: str
    """Host name of the holding process."""
    pid: int
    """Process id of the holding process (rank 0 of the job)."""
    since: float
    """Unix seconds when it took the directory."""

    def describe(self) -> str:
        run = f"run {self.run_id}, " if self.run_id else ""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"{run}pid {self.pid} on {self.host}, since {since}"


def current_owner(run_id: str | None = None) -> Owner:
    """This process as an owner."""
    if run_id is None:
        run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    host = os.environ.get("TRAINGUARD_NODE") or socket.gethostname()
    return Owner(run_id=run_id, host=host, pid=os.getpid(), since=time.time())


class _Held:
    """One open, locked lock file, shared by every `Checkpointer` of this process on that directory."""

    def __init__(self, fd: int, key: tuple[int, int]) -> None:
        self.fd = fd
        self.key = key
        self.users = 0


# flock conflicts between two descriptors even inside one process, yet two Checkpointers of one
# process on one directory are the same job (a restore helper next to the saving one): share the lock.
_registry: dict[tuple[int, int], _Held] = {}
_registry_lock = threading.Lock()


class DirectoryLock:
    """This process's hold on a checkpoint directory; `release` (idempotent) gives it up."""

    def __init__(self, held: _Held | None, path: Path) -> None:
        self._held = held
        self.path = path

    @property
    def held(self) -> bool:
        return self._held is not None

    def release(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        with _registry_lock:
            held.users -= 1
            if held.users > 0:
                return
            _registry.pop(held.key, None)
        # The file stays: unlinking it would let a third job lock a new inode while a second one
        # still waits on the old one.
        os.close(held.fd)  # closing drops the flock


def _read_owner(fd: int) -> Owner | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)  # read again from the start on every poll
        data = json.loads(read_capped(fd, _MAX_OWNER_BYTES, "lock file").decode("utf-8"))
        return Owner(str(data["run_id"]), str(data["host"]), int(data["pid"]), float(data["since"]))
    except (CheckpointError, OSError, ValueError, KeyError, TypeError):
        return None  # written by nobody yet, or damaged: the message then names no holder


def acquire(directory: Path, owner: Owner, *, wait_same_run_seconds: float = 30.0) -> DirectoryLock:
    """Take ``directory`` for ``owner``'s job, creating it (0750) if needed.

    Raises `CheckpointError` naming the holder when another job holds it. When the holder has the
    same non-empty run id (the previous attempt of this job, still exiting after the supervisor's
    SIGTERM), waits up to ``wait_same_run_seconds`` for it to go. A directory where no lock file can
    be created (read-only file system) is used unlocked, with a warning: nothing can be saved there.
    """
    make_dirs(directory)
    path = directory / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            log.warning("checkpoint directory %s cannot be locked (%s): used without a lock", directory, exc.strerror)
            return DirectoryLock(None, path)
        reason = "is a symlink" if exc.errno == errno.ELOOP else f"cannot be opened: {exc.strerror}"
        raise CheckpointError(f"lock file {path} {reason}") from None
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with _registry_lock:
            held = _registry.get(key)
            if held is not None:
                held.users += 1
                os.close(fd)
                return DirectoryLock(held, path)
        deadline = time.monotonic() + wait_same_run_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _read_owner(fd)
                same_run = holder is not None and owner.run_id != "" and holder.run_id == owner.run_id
                if not same_run or time.monotonic() >= deadline:
                    who = holder.describe() if holder is not None else "another process"
                    raise CheckpointError(
                        f"checkpoint directory {directory} is in use by another job ({who}); "
                        "give each job its own directory, or stop that job first"
                    ) from None
                time.sleep(_POLL_SECONDS)
        record = json.dumps(
            {"run_id": owner.run_id, "host": owner.host, "pid": owner.pid, "since": owner.since}
        ).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record + b"\n", 0)
        with contextlib.suppress(PermissionError):  # created by another user of the group: its mode is theirs
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    held = _Held(fd, key)
    held.users = 1
    with _registry_lock:
        _registry[key] = held
    log.debug("checkpoint directory %s taken by %s", directory, owner.describe())
    return DirectoryLock(held, path)
