"""DCP storage writer that checksums every file while writing it, plus the staging copy.

`ChecksumWriter` is a `torch.distributed.checkpoint.FileSystemWriter` whose streams compute the
checksum (xxh3_64 or crc32) and the size of each file as the bytes pass (no second read), the hash
beside the write (`trainguard.checkpoint.overlap`). `WriteHooks` is the test
seam (`DiskQuota` makes the writes fail with a real ``ENOSPC`` ``OSError`` once a byte budget is spent).
`CachingStager` copies the state into CPU buffers reused from save to save, so the blocking part of
an async save is one memory copy.
"""

from __future__ import annotations

import copy
import errno
import io
import os
import threading
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from trainguard.checkpoint.checksum import new_hasher
from trainguard.checkpoint.overlap import write_hashed
from trainguard.checkpoint.safefs import FILE_MODE, make_dirs


class WriteHooks:
    """Fault-injection seam of the checkpointer (tests subclass it); the defaults do nothing."""

    def before_write(self, path: Path, size: int) -> int:
        """Called before ``size`` bytes go to ``path``; return how many may be written (fewer = ENOSPC)."""
        return size

    def before_commit(self, staging: Path, step: int) -> None:
        """Called on the committing rank after the manifest is written, before the rename."""

    def during_memory_copy(self, step: int, slot: memoryview) -> None:
        """Called as a memory-tier copy starts overwriting its slot (described no more), with the slot's
        first half: a test may scribble there and kill the process, as if the copy stopped midway."""


class DiskQuota(WriteHooks):
    """A byte budget shared by the writes of one process; ``None`` means unlimited.

    Tests set ``remaining`` to a small number before a save to make that save hit a full disk:
    the writer writes what still fits, then raises ``OSError(ENOSPC)`` like a real full disk.
    """

    def __init__(self, remaining: int | None = None) -> None:
        self.remaining = remaining
        self._lock = threading.Lock()

    def before_write(self, path: Path, size: int) -> int:
        """Reserve up to ``size`` bytes; returns how many may be written."""
        with self._lock:
            if self.remaining is None:
                return size
            granted = min(size, max(self.remaining, 0))
            self.remaining -= granted
            return granted


class _ChecksumStream(io.RawIOBase):
    """A write-only file that keeps a running crc32 and size of what was written."""

    def __init__(self, path: Path, owner: ChecksumWriter) -> None:
        super().__init__()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        os.fchmod(fd, FILE_MODE)  # exactly 0640, whatever the umask
        self._fh = open(fd, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self._path = path
        self._owner = owner
        self._hasher = new_hasher(owner.algorithm)
        self._size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        hooks = self._owner.hooks
        allowed = view.nbytes if hooks is None else hooks.before_write(self._path, view.nbytes)
        if allowed < view.nbytes:
            self._fh.write(view[:allowed])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self._path))
        # Hashed in a helper thread one chunk behind the writes; write-back starts chunk by chunk.
        write_hashed(self._hasher, self._fh.fileno(), view, self._size, str(self._path))
        self._size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._size

    def fileno(self) -> int:
        return self._fh.fileno()

    def flush(self) -> None:
        if not self._fh.closed:
            self._fh.flush()

    def close(self) -> None:
        if not self.closed:
            self._fh.close()
            self._owner.record_file(self._path.name, self._size, self._hasher.hexdigest())
        super().close()


class _ChecksumFS(FileSystem):
    def __init__(self, owner: ChecksumWriter) -> None:
        self._owner = owner

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = _ChecksumStream(Path(path), self._owner)
        try:
            yield stream
        finally:
            stream.close()

    def mkdir(self, path: str | os.PathLike) -> None:
        make_dirs(Path(path))  # the staging directory: 0750, whatever the umask

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        super().rename(path, new_path)
        self._owner.renamed_file(Path(path).name, Path(new_path).name)


class ChecksumWriter(FileSystemWriter):
    """FileSystemWriter (one file per rank, fsync on) that records ``{file: (size, checksum)}`` it wrote."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        algorithm: str = "crc32",
        hooks: WriteHooks | None = None,
        sync_files: bool = True,
    ) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=sync_files, thread_count=1, overwrite=True)
        self.fs = _ChecksumFS(self)
        self.hooks = hooks
        self.algorithm = algorithm
        new_hasher(algorithm)  # fail early on an unavailable algorithm
        self.files: dict[str, tuple[int, str]] = {}
        self._files_lock = threading.Lock()

    def record_file(self, name: str, size: int, digest: str) -> None:
        with self._files_lock:
            self.files[name] = (size, digest)

    def renamed_file(self, old: str, new: str) -> None:
        with self._files_lock:
            if old in self.files:
                self.files[new] = self.files.pop(old)


def _walk_copy(value: Any, path: str, cache: dict[str, torch.Tensor], seen: set[str]) -> Any:
    if isinstance(value, torch.Tensor):
        src = value.detach()
        buf = cache.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype or buf.device.type != "cpu":
            buf = torch.empty(src.shape, dtype=src.dtype, device="cpu")
            cache[path] = buf
        seen.add(path)
        buf.copy_(src)
        return buf
    if isinstance(value, dict):
        return {k: _walk_copy(v, f"{path}.{k}", cache, seen) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_walk_copy(v, f"{path}.{i}", cache, seen) for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    return copy.deepcopy(value)


class CachingStager:
    """An `AsyncStager` for ``dcp.async_save``: copies tensors into CPU buffers reused across saves.

    The copy is done before ``stage`` returns, so training may change its tensors right after.
    The buffers are only reused by the next save, which starts after the previous one finished.
    """

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self._cache: dict[str, torch.Tensor] = {}

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        seen: set[str] = set()
        staged = {k: _walk_copy(v, str(k), self._cache, seen) for k, v in state_dict.items()}
        for stale in set(self._cache) - seen:
            del self._cache[stale]
        return staged

    def synchronize_staging(self) -> None:
        """Staging is synchronous: nothing to wait for."""

    def close(self) -> None:
        self._cache.clear()

    def cached_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._cache.values())

    def __iter__(self) -> Iterator[str]:  # pragma: no cover - debugging aid
        return iter(self._cache)
