"""One run per run folder: the live run's lock, and the watch for a folder deleted or replaced mid-run.

**Lock.** Each node agent holds ``flock`` on ``<run dir>/nodes/<node>.lock`` for as long as it runs; the
file names its holder (pid, host, node, start time). A second ``trainguard run`` on the folder with the same
node id is refused (`RunDirBusyError`, exit 2) with the holder named, instead of both runs "completing" with
their events interleaved and the second restoring the first's checkpoints. The kernel drops a flock when its
holder dies, so the lock of a dead run is simply taken over. Agents of one multi-node job share the folder,
each under its own node id.

**Watch.** A thread compares the folder's device and inode with those it had at the start, every second.
When the folder is gone (``rm -rf``) or another one has its name (``mv`` and a new folder), every record
written from then on would be lost or land in a folder the run does not own: the watch stops the run the way
a SIGTERM does (the agent's signal handling stops the workers in any phase), and `supervise` ends it with
status ``lost`` (exit 4) and writes what it still knows (`write_lost_summary`) next to the folder, or into
the temporary directory when that cannot be written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.core.safefs import make_dirs
from trainguard.errors import UsageError

log = logging.getLogger(__name__)

WATCH_SECONDS = 1.0
"""How often the watch looks at the run folder."""


class RunDirBusyError(UsageError):
    """Another live run holds this run folder (for this node)."""


def lock_path(run_dir: Path, node: str) -> Path:
    return run_dir / "nodes" / f"{node}.lock"


@dataclass
class RunDirLock:
    """This process's hold on a run folder for one node."""

    path: Path
    fd: int
    holders: int = 1
    """How many holds of this process it stands for (the CLI's and `supervise`'s)."""

    def release(self) -> None:
        self.holders -= 1
        if self.holders > 0:
            return
        _HELD.pop(str(self.path), None)
        with contextlib.suppress(OSError):
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(self.fd)


_HELD: dict[str, RunDirLock] = {}
"""The locks this process holds, by path (a second flock of the same file from this process would wait on
the first, whose open file description is another)."""


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "a live run (its lock file names no holder yet)"
    since = info.get("started")
    when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, int | float) else ""
    return f"pid {info.get('pid')} on host {info.get('host', '?')} (node {info.get('node', '?')}{when})"


def hold_run_dir(run_dir: Path, node: str) -> RunDirLock:
    """Hold ``run_dir`` for ``node`` (created if needed); raises `RunDirBusyError` naming the live holder."""
    path = lock_path(Path(run_dir), node)
    held = _HELD.get(str(path))
    if held is not None:
        held.holders += 1
        return held
    make_dirs(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunDirBusyError(f"run dir {run_dir} is in use by {holder}: two runs on one folder would mix their "
                              f"events and checkpoints; give another --run-dir, or stop that run first") from None
    except OSError as exc:  # a file system without locks (some NFS and Lustre mounts): run, but say so
        log.warning("cannot lock %s (%s): a second run on this folder would not be refused", path, exc.strerror)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "node": node, "started": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode() + b"\n", 0)
    lock = RunDirLock(path, fd)
    _HELD[str(path)] = lock
    return lock


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class RunDirWatch:
    """Notices the run folder being deleted or replaced while the run goes on, and stops the run."""

    def __init__(self, run_dir: Path, stop: Callable[[], None] | None = None,
                 interval_seconds: float = WATCH_SECONDS) -> None:
        self.run_dir = Path(run_dir)
        self.identity = _identity(self.run_dir)
        try:  # the folder itself, whatever its name becomes: a deleted one has no links left
            self._fd: int | None = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            self._fd = None
        self.interval_seconds = interval_seconds
        self._stop_run = stop or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.lost: str | None = None
        """Why the run folder is no longer the run's (None while it is)."""
        self.lost_after: float | None = None
        self._started = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainguard-run-dir-watch", daemon=True)

    def start(self) -> RunDirWatch:
        if self.identity is not None:
            self._thread.start()
        return self

    def check(self) -> str | None:
        """Why the folder is lost now, or None."""
        deleted = f"run directory {self.run_dir} was deleted while the run went on"
        if self._fd is not None:
            with contextlib.suppress(OSError):
                if os.fstat(self._fd).st_nlink == 0:  # even if something made a new folder of that name since
                    return deleted
        now = _identity(self.run_dir)
        if now is None:
            return deleted
        if now != self.identity:
            return f"run directory {self.run_dir} was replaced by another folder while the run went on"
        return None

    def _loop(self) -> None:
        while not self._done.wait(self.interval_seconds):
            why = self.check()
            if why is not None:
                self.lost, self.lost_after = why, time.monotonic() - self._started
                log.error("%s: stopping the run", why)
                self._stop_run()
                return

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _agent_events(events_path: Path, limit: int = 64 * 1024 * 1024) -> list[Any]:
    """The agent's event records, read back through this process's still-open descriptor of its (deleted or
    moved) event file."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return []
    want = {str(events_path), f"{events_path} (deleted)"}
    for name in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target in want or target.endswith(f"/{events_path.name}") or target.endswith(f"/{events_path.name} "
                                                                                            "(deleted)"):
            try:
                data = os.pread(int(name), limit, 0)
            except OSError:
                continue
            out = []
            for line in data.splitlines():
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
            return out
    return []


def write_lost_summary(run_dir: Path, events_path: Path, summary: dict[str, Any]) -> Path | None:
    """Write what the run still knows (its summary, ``run_ended``, the agent's records as far as its open event
    file still has them) to ``<run dir>.lost-<pid>.json`` beside the folder, else into the temporary
    directory. Returns where, or None when nowhere could be written."""
    doc = {**summary, "agent_events": _agent_events(events_path)}
    data = json.dumps(doc, indent=2, default=str).encode() + b"\n"
    name = f"{run_dir.name}.lost-{os.getpid()}.json"
    for folder in (run_dir.parent, Path(tempfile.gettempdir())):
        path = folder / name if folder == run_dir.parent else folder / f"trainguard-{name}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return path
    return None
