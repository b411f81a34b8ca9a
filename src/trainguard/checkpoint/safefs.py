"""File access confined to one checkpoint directory: no symlinks, no ``..``, regular files only, bounded reads.

Also the modes of what the checkpointer creates (directories 0750, files 0640, whatever the umask).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainguard.checkpoint.errors import CheckpointError
from trainguard.core import safefs as _core

log = logging.getLogger(__name__)

DIR_MODE = _core.DIR_MODE
"""Mode of every directory the checkpointer creates (training state is not for every local user)."""
FILE_MODE = _core.FILE_MODE
"""Mode of every file the checkpointer creates (shards, ``.metadata``, manifest, lock file)."""
MAX_NAME_BYTES = 255
"""Longest file name a checkpoint may list (the usual NAME_MAX)."""

# O_NONBLOCK: opening a FIFO planted in a checkpoint must not wait for a writer; it is refused
# afterwards because it is not a regular file. O_NOFOLLOW: a symlink as the last component is ELOOP.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def check_name(name: object) -> str:
    """``name`` if it is a plain file name inside a checkpoint directory; `CheckpointError` otherwise.

    Checkpoints are flat (DCP writes ``.metadata`` and ``__<rank>_<n>.distcp`` side by side), so any
    separator, ``.``/``..``, NUL or control character means a damaged or hostile manifest.
    """
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"file name {name!r:.80} is not a non-empty string")
    if name in (".", "..") or "/" in name or "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise CheckpointError(f"file name {name!r:.80} is not a plain name inside the checkpoint directory")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise CheckpointError(f"file name {name!r:.80} is not valid UTF-8") from None
    if len(encoded) > MAX_NAME_BYTES:
        raise CheckpointError(f"file name of {len(encoded)} bytes is longer than {MAX_NAME_BYTES}")
    return name


@contextmanager
def open_checkpoint_dir(path: Path) -> Iterator[int]:
    """A descriptor of the checkpoint directory ``path`` (``<root>/step-N``), which must be a real directory.

    The root above it may be reached through symlinks (a scratch file system mounted elsewhere);
    ``step-N`` itself may not: a symlinked checkpoint could point anywhere.
    """
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint directory is missing") from None
    except OSError as exc:
        kind = _kind(path)
        if kind or exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CheckpointError(f"{path}: not a real directory ({kind or 'symlink or file'})") from None
        raise CheckpointError(f"{path}: cannot open checkpoint directory: {exc.strerror}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _kind(path: Path) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISLNK(mode):
        return "a symlink"
    if not stat.S_ISDIR(mode):
        return "not a directory"
    return ""


@contextmanager
def open_regular(dir_fd: int, name: str, label: str) -> Iterator[tuple[int, int]]:
    """(descriptor, size) of the regular file ``name`` directly inside ``dir_fd``, never following a symlink."""
    check_name(name)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise CheckpointError(f"{label} is missing") from None
    except OSError as exc:
        # ELOOP is what O_NOFOLLOW answers for a symlink; anything else (EACCES, EIO) is named as is.
        reason = "is a symlink" if exc.errno == errno.ELOOP else f"cannot be opened: {exc.strerror}"
        raise CheckpointError(f"{label} {reason}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{label} is not a regular file")
        os.set_blocking(fd, True)
        yield fd, st.st_size
    finally:
        os.close(fd)


def read_capped(fd: int, limit: int, label: str) -> bytes:
    """All of the file behind ``fd``; `CheckpointError` if it holds more than ``limit`` bytes."""
    chunks = []
    total = 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise CheckpointError(f"{label} is larger than {limit} bytes")
    return b"".join(chunks)


def make_dirs(path: Path, mode: int = DIR_MODE) -> None:
    """``mkdir -p`` giving every directory it creates exactly ``mode`` (the umask is not consulted)."""
    _core.make_dirs(path, mode)
