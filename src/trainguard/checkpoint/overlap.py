"""Checksums computed beside the writes: chunk ``i`` is hashed in a helper thread while chunk ``i + 1`` is written.

xxhash and zlib release the GIL on large buffers, so the hash of a chunk costs no time of the thread
doing the I/O. Chunks are hashed strictly in the order given (one helper thread). The caller hands over
memory it does not own beyond its own call (``torch.save``'s buffers), so a write returns only once
each chunk it passed has been hashed. Writes also start the kernel's write-back of every chunk at once
(``sync_file_range``), so the final fsync has little left to wait for. (Reads hash inline: beside the
read, and with ``posix_fadvise(WILLNEED)``, restores measured slower on the 2-core benchmark machine.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from trainguard.checkpoint.checksum import Hasher

log = logging.getLogger(__name__)

CHUNK = 2 << 20
"""Bytes per hashed chunk: large enough that the GIL is released, small enough for a deep overlap."""
OVERLAP_MIN = 2 * CHUNK
"""Buffers smaller than this are hashed inline (handing them over costs more than it saves)."""

_SYNC_FILE_RANGE_WRITE = 2
_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()
_sync_file_range: Callable[[int, int, int, int], int] | None = None
_sync_file_range_looked_up = False


def _helper() -> ThreadPoolExecutor:
    """The process's one hashing thread (every hasher's chunks queue in submission order)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(1, thread_name_prefix="trainguard-checksum")
        return _executor


def _hash_chunks(hasher: Hasher, view: memoryview, step: Callable[[memoryview, int], None]) -> None:
    """Call ``step(chunk, offset)`` for each chunk of ``view`` in order, hashing chunk i while step i+1 runs."""
    pending: Future[None] | None = None
    try:
        for start in range(0, view.nbytes, CHUNK):
            chunk = view[start : start + CHUNK]
            step(chunk, start)
            if pending is not None:
                pending.result()
            pending = _helper().submit(hasher.update, chunk)
    finally:
        if pending is not None:
            pending.result()  # never return while the helper still reads the caller's memory


def write_hashed(hasher: Hasher, fd: int, view: memoryview, file_offset: int, name: str) -> None:
    """Write all of ``view`` to ``fd`` (at its current position, ``file_offset`` bytes into file ``name``), hash it."""

    def write(chunk: memoryview, start: int) -> None:
        written = 0
        while written < chunk.nbytes:
            n = os.write(fd, chunk[written:])
            if not n:
                raise OSError(errno.ENOSPC, "short write", name)
            written += n
        start_writeback(fd, file_offset + start, chunk.nbytes)

    if view.nbytes < OVERLAP_MIN:
        write(view, 0)
        hasher.update(view)
        return
    _hash_chunks(hasher, view, write)


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``[offset, offset + length)`` out now, without waiting (Linux only).

    Durability still comes from the fsync at the end; this only moves the disk's work earlier, beside
    the writes of the following chunks.
    """
    global _sync_file_range, _sync_file_range_looked_up
    if not _sync_file_range_looked_up:
        _sync_file_range_looked_up = True
        _sync_file_range = _lookup_sync_file_range()
    if _sync_file_range is None or length < CHUNK:
        return
    if _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE) != 0:
        # Only a hint: a file system without it (EINVAL, ESPIPE) is written back by the fsync alone.
        _sync_file_range = None
        log.debug("sync_file_range unavailable (errno %d); fsync alone writes checkpoints back", ctypes.get_errno())


def _lookup_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn
