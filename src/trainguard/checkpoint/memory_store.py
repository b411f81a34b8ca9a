"""Where memory-tier copies live on a node: 0700 directories under /dev/shm, two slots per rank, a memory bound.

Layout: ``<root>/trainguard-mem-<uid>/<run id>/node-<node>/`` holds ``own/rank-R/`` (copies the node's
ranks wrote) and ``replicas/rank-R/`` (copies other nodes pushed to this node's holder). Each rank
directory has two slots (``slot-K.bin`` data, ``slot-K.json`` its `CopyMeta`): a save overwrites the
older slot after removing its description, and describes it again only once the data and checksum are
complete, so a save interrupted mid-copy leaves the other slot valid. Every directory must be ours,
0700 and not a link, every file is opened without following links: another local user can neither
read the copies nor plant one (a copy is also verified by checksum before it is used). When another
user planted ``trainguard-mem-<uid>`` first, the job uses a fresh private folder instead (`node_dir`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.memory_meta import MAX_META_BYTES, CopyMeta

log = logging.getLogger(__name__)

SLOTS = 2
_NODE = re.compile(r"[^A-Za-z0-9._-]")
GB = 1 << 30


def run_id(checkpoint_dir: Path) -> str:
    """The memory tier's name for a job: one job per checkpoint directory (the directory lock ensures it)."""
    return hashlib.sha256(os.fsencode(os.path.abspath(checkpoint_dir))).hexdigest()[:16]


def secure_dir(path: Path) -> Path:
    """Create ``path`` (0700) if missing; `CheckpointError` unless it is a real directory of ours, 0700."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise CheckpointError(f"memory checkpoint directory {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise CheckpointError(
            f"refusing memory checkpoint directory {path}: it must be a 0700 directory of this user, not a link"
        )
    return path


_warned = False
"""Whether this process said already that it uses a private folder (once is enough on the console)."""


def node_dir(root: Path, run: str, node: str, record: Path | None = None) -> Path:
    """This node's directory for run ``run`` (created, checked at every level).

    When ``<root>/trainguard-mem-<uid>`` is not a 0700 directory of ours (another local user may have created
    it first, to make every job of ours refuse the tier), and ``record`` (a directory of this job) is given,
    the job's folder is a fresh one with an unguessable name instead, recorded in ``record`` so that every
    rank of the node, in every attempt, finds the same one. Without ``record``, `CheckpointError`.
    """
    name = f"node-{_NODE.sub('_', node)[:128]}"
    try:
        base = secure_dir(Path(root) / f"trainguard-mem-{os.getuid()}")
        return secure_dir(secure_dir(base / run) / name)
    except CheckpointError as exc:
        if record is None:
            raise
        global _warned
        if not _warned:
            _warned = True
            log.warning("%s; using a private memory checkpoint folder instead", exc)
    return secure_dir(_private_job_dir(Path(root), run, name, record) / name)


def _is_private(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _private_job_dir(root: Path, run: str, name: str, record: Path) -> Path:
    """The job's private folder under ``root`` for node ``name``: the one ``record`` names if it is still a
    0700 directory of ours there, else a new one (mkdtemp: created 0700 with O_EXCL, an unpredictable name)."""
    prefix = f"trainguard-mem-{os.getuid()}-{run}-"
    pointer = record / f".memory-dir.{name}"
    lock = _open(record / f".memory-dir.{name}.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the node's ranks start together: one creates, the others read
        with contextlib.suppress(OSError, CheckpointError, UnicodeDecodeError):
            fd = _open(pointer, os.O_RDONLY)
            try:
                recorded = Path(os.read(fd, 4096).decode())
            finally:
                os.close(fd)
            if recorded.parent == root and recorded.name.startswith(prefix) and _is_private(recorded):
                return recorded
        try:
            created = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        except OSError as exc:
            raise CheckpointError(f"cannot create a private memory checkpoint folder in {root}: {exc}") from None
        if not _is_private(created):
            raise CheckpointError(f"refusing memory checkpoint directory {created}: not a 0700 directory of ours")
        tmp = record / f".memory-dir.{name}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = _open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            os.write(fd, os.fsencode(created))
        finally:
            os.close(fd)
        os.rename(tmp, pointer)
        return created
    finally:
        os.close(lock)


def rank_dir(node: Path, kind: str, rank: int) -> Path:
    return secure_dir(secure_dir(node / kind) / f"rank-{rank}")


def _open(path: Path, flags: int) -> int:
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise CheckpointError(f"refusing memory checkpoint file {path}: not a regular file of this user")
    return fd


@dataclass(frozen=True)
class Copy:
    """A described slot: its description and data file."""

    slot: int
    meta: CopyMeta
    data: Path


def copies(directory: Path) -> list[Copy]:
    """The described slots of a rank directory, newest step first; unreadable descriptions are skipped."""
    found = []
    for slot in range(SLOTS):
        try:
            fd = _open(directory / f"slot-{slot}.json", os.O_RDONLY)
        except (OSError, CheckpointError):
            continue
        try:
            meta = CopyMeta.from_bytes(os.read(fd, MAX_META_BYTES + 1))
        except CheckpointError:
            continue
        finally:
            os.close(fd)
        found.append(Copy(slot, meta, directory / f"slot-{slot}.bin"))
    return sorted(found, key=lambda c: c.meta.step, reverse=True)


def replica_steps(node: Path) -> dict[int, list[int]]:
    """Rank -> the described steps of the replicas ``node`` holds for other nodes' ranks."""
    held: dict[int, list[int]] = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(node / "replicas"):
            if entry.name.startswith("rank-") and entry.name[5:].isdigit() and entry.is_dir(follow_symlinks=False):
                held[int(entry.name[5:])] = [c.meta.step for c in copies(Path(entry.path))]
    return held


@contextlib.contextmanager
def node_lock(node: Path) -> Iterator[None]:
    """The node's accounting lock (ranks and the holder reserve memory under it)."""
    fd = _open(node / "bound.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def usage(node: Path, excluding: Path | None = None) -> int:
    """Bytes of every slot on the node, ``excluding`` one (the slot about to be overwritten)."""
    total = 0
    for kind in ("own", "replicas"):
        with contextlib.suppress(FileNotFoundError):
            for rank in os.scandir(node / kind):
                if not rank.is_dir(follow_symlinks=False):
                    continue
                for entry in os.scandir(rank.path):
                    if entry.name.endswith(".bin") and entry.path != str(excluding):
                        total += entry.stat(follow_symlinks=False).st_size
    return total


def begin(node: Path, directory: Path, size: int, bound_bytes: int, who: str) -> tuple[int, mmap.mmap]:
    """Reserve the older slot of ``directory`` for ``size`` bytes and map it writable.

    Its description is removed first (the slot stops being a valid copy before a byte changes). Raises
    `CheckpointError` when the node's memory bound would be exceeded.
    """
    held = copies(directory)
    slot = next((s for s in range(SLOTS) if s not in {c.slot for c in held}), held[-1].slot if held else 0)
    data = directory / f"slot-{slot}.bin"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / f"slot-{slot}.json")
    with node_lock(node):
        used = usage(node, excluding=data)
        if used + size > bound_bytes:
            raise CheckpointError(
                f"memory checkpoint of {who} needs {size / GB:.3f} GB but node {node.name} already holds "
                f"{used / GB:.3f} GB of the {bound_bytes / GB:.3f} GB allowed (CheckpointConfig.memory_gb)"
            )
        fd = _open(data, os.O_RDWR | os.O_CREAT)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            # Populated up front: one pass over the pages instead of a fault per page inside the copy.
            mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)) if size \
                else mmap.mmap(-1, 1)
        finally:
            os.close(fd)
    return slot, mapped


def describe(directory: Path, slot: int, meta: CopyMeta) -> None:
    """Make ``slot`` a valid copy: write its description atomically (temporary file, then rename)."""
    tmp = directory / f".slot-{slot}.json.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = _open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        os.write(fd, meta.to_bytes())
    finally:
        os.close(fd)
    os.rename(tmp, directory / f"slot-{slot}.json")


def map_copy(copy: Copy) -> mmap.mmap:
    """The data of a described slot, mapped copy-on-write (the caller verifies it against its description)."""
    fd = _open(copy.data, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size < copy.meta.size or size == 0:
            raise CheckpointError(f"memory copy {copy.data} is truncated")
        return mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
