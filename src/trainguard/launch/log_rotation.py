"""Rotation of a rank log that its writers keep appending to: the older part moves to ``<file>.1``.

The writers (workers' stdout and stderr) hold their descriptors for the whole attempt, so the file cannot be
renamed away; its front has to leave in place. Where the filesystem can remove a file's front (Linux
``fallocate(FALLOC_FL_COLLAPSE_RANGE)``: ext4, XFS), every whole block below the end moves and the kernel
shifts what is left, appends made meanwhile included: no byte is lost. Elsewhere (tmpfs, NFS, files under one
block) the file is copied and truncated, and a write that lands between the last copied byte and the truncation
is lost from the files, as with logrotate's ``copytruncate``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ROTATED_SUFFIX = ".1"
COPY_BYTES = 1 << 24
"""One ``sendfile`` call."""
CATCH_UP_BYTES = 64 * 1024
"""The copy-and-truncate fallback cuts once less than this is left to copy."""
_COLLAPSE_RANGE = 0x08  # FALLOC_FL_COLLAPSE_RANGE, linux/falloc.h


def _libc_fallocate() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong)
    fn.restype = ctypes.c_int
    return fn


_fallocate = _libc_fallocate()


def collapse_front(fd: int, length: int) -> bool:
    """Remove the first ``length`` bytes of the open file ``fd`` (a multiple of its block size, below its
    end); False when this filesystem or kernel cannot."""
    if _fallocate is None:
        return False
    if _fallocate(fd, _COLLAPSE_RANGE, 0, length) == 0:
        return True
    err = ctypes.get_errno()
    if err not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS, errno.EPERM):
        log.debug("collapse of a log's front failed: %s", os.strerror(err))
    return False


def _copy(src: int, dst: int, start: int, end: int) -> int:
    """Copy ``[start, end)`` of ``src`` to the end of ``dst``; returns where the copy stopped."""
    pos = start
    while pos < end:
        n = os.sendfile(dst, src, pos, min(end - pos, COPY_BYTES))
        if n == 0:
            break
        pos += n
    return pos


def _copy_and_truncate(src: int, dst: int, keep: int) -> int:
    size = os.fstat(src).st_size
    pos = max(0, size - keep) if keep > 0 else 0
    while True:  # catch up with the writer until what is left is small, then cut at once
        pos = _copy(src, dst, pos, size)
        size = os.fstat(src).st_size
        if size - pos < CATCH_UP_BYTES:
            break
    while (n := os.sendfile(dst, src, pos, COPY_BYTES)) > 0:
        pos += n
    os.ftruncate(src, 0)
    return pos


def rotate(path: Path, keep: int = 0) -> int:
    """Move the front of ``path`` to ``<path>.1`` (atomically replacing it); with ``keep``, only the newest
    ``keep`` bytes of that front go to ``<path>.1`` (the rest is dropped). Returns how many bytes left the
    front of ``path``: a reader's offset in it moves back by that much."""
    rotated = path.with_name(path.name + ROTATED_SUFFIX)
    tmp = path.with_name(path.name + ROTATED_SUFFIX + ".tmp")
    src = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        st = os.fstat(src)
        block = st.st_blksize or 4096
        cut = (st.st_size - 1) // block * block  # strictly below the end, as the collapse requires
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
        try:
            if cut > 0:
                _copy(src, dst, max(0, cut - keep) if keep > 0 else 0, cut)
                if collapse_front(src, cut):
                    removed = cut
                else:  # start the copy over, the whole file this time
                    os.ftruncate(dst, 0)
                    os.lseek(dst, 0, os.SEEK_SET)
                    removed = _copy_and_truncate(src, dst, keep)
            else:
                removed = _copy_and_truncate(src, dst, keep)
        except BaseException:
            os.close(dst)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(dst)
        os.replace(tmp, rotated)
    finally:
        os.close(src)
    return removed
