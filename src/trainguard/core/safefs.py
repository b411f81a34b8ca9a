"""Folders and files trainguard creates: fixed modes whatever the umask, and nothing another user can redirect.

Folders are created ``0750`` and files ``0640`` (a ``umask 000`` shell must not make them world-writable).
Evidence goes only into a folder that is a real directory owned by this user (a symlink planted in its
place is refused), and every file is first created exclusively under a random name
(``O_EXCL|O_NOFOLLOW``: a planted symlink or file makes the create fail instead of being followed) and
then renamed into place, which replaces a planted entry instead of writing through it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

DIR_MODE = 0o750
"""Folders trainguard creates: the owner writes, the group reads, others see nothing."""
FILE_MODE = 0o640


class UnsafePathError(OSError):
    """A folder trainguard would write into is a symlink, not a directory, or someone else's."""


def make_dirs(path: str | os.PathLike[str], mode: int = DIR_MODE) -> Path:
    """``mkdir -p`` giving every folder it creates exactly ``mode`` (not the umask's); folders that already
    exist keep theirs. Raises `OSError` when a folder cannot be created."""
    target = Path(path)
    missing: list[Path] = []
    p = target
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)
        except FileExistsError:
            continue  # another process created it first: it is theirs, leave its mode alone
        # mkdir's mode is filtered by the umask (077 would give 0700, 000 gives 0777): set it outright
        os.chmod(folder, mode, follow_symlinks=False)
    return target


def open_private_dir(path: Path) -> int:
    """A descriptor of the directory ``path`` (created if missing) that the caller closes.

    Raises `UnsafePathError` when ``path`` itself is a symlink or not a directory, or is owned by
    another user; `OSError` when it cannot be created.
    """
    make_dirs(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(exc.errno, f"refusing {path}: not a real directory (symlink?)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise UnsafePathError(errno.EPERM, f"refusing {path}: not a directory owned by uid {os.getuid()}")
    return fd


def write_file_at(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``data`` as ``name`` in the open directory: exclusive temp file, then an atomic rename."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"not a plain file name: {name!r}")
    tmp = f".{name}.{os.urandom(8).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE,
                 dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    try:
        # rename replaces whatever entry has the final name (a planted symlink included) without following it
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def open_heartbeat(directory: Path, name: str) -> int:
    """A write descriptor of the heartbeat file ``directory/name`` (created if missing, never a symlink)."""
    dfd = open_private_dir(directory)
    try:
        # O_NONBLOCK: a FIFO planted under the name must not block the worker (regular files ignore it)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, FILE_MODE,
                     dir_fd=dfd)
    finally:
        os.close(dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(errno.EINVAL, f"heartbeat {directory / name} is not a regular file")
    return fd


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` with `FILE_MODE` in its folder (created `DIR_MODE` if missing), via `write_file_at`."""
    dfd = open_private_dir(path.parent)
    try:
        write_file_at(dfd, path.name, data)
    finally:
        os.close(dfd)


def create_exclusive(path: Path, data: bytes) -> bool:
    """Create ``path`` with `FILE_MODE` holding ``data`` unless it exists (True when this call created it).

    The create is atomic (``O_EXCL``), so of two processes racing for one marker exactly one wins;
    a symlink under the name counts as existing and is never followed.
    """
    make_dirs(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return True
