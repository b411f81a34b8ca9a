"""One checkpoint file read once through a running checksum, and its items as files ``torch.load`` can read.

`HashedFile` hashes a file strictly in order. `ItemStream` serves ``torch.load`` one item (a
``torch.save`` zip inside the shard file) without a copy of its tensor data: ``torch.load`` first reads
the zip's small records near the end and the start of the item, then the tensor's bytes in one
``readinto`` of its own storage. Small reads ahead of the checksum are read from the file and kept;
the large read is read directly into ``torch.load``'s buffer once everything before it was hashed
(from what was kept, or read then). So every byte is read from the file once and what ``torch.load``
used is exactly what was hashed.
"""

from __future__ import annotations

import io
import os
from typing import Any

from trainguard.checkpoint.checksum import READ_CHUNK, Hasher, new_hasher
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.manifest import FileEntry

SMALL_READ = 1 << 20
"""Reads below this size are kept in memory (``torch.load`` reads zip headers more than once)."""


class HashedFile:
    """An open checkpoint file whose bytes go through the manifest's checksum in order, each read once."""

    def __init__(self, fd: int, name: str, entry: FileEntry, algorithm: str) -> None:
        self.fd = fd
        self.name = name
        self.entry = entry
        self.hasher: Hasher = new_hasher(algorithm)
        self.pos = 0
        """Bytes hashed so far (from the start of the file)."""
        self._scratch: bytearray | None = None

    def pread(self, view: memoryview, offset: int) -> None:
        """Fill ``view`` from ``offset`` without hashing; `CheckpointError` if the file ends first."""
        got = 0
        while got < view.nbytes:
            try:
                n = os.preadv(self.fd, [view[got:]], offset + got)
            except OSError as exc:
                raise CheckpointError(f"file {self.name} cannot be read: {exc.strerror}") from None
            if not n:
                end = offset + got
                raise CheckpointError(f"file {self.name} ends at byte {end}, manifest says {self.entry.size}")
            got += n

    def read_into(self, view: memoryview) -> None:
        """Fill ``view`` with the next bytes to hash, and hash them.

        Inline, not beside the read on a helper thread: on the 2-core benchmark machine the thread and
        the kernel's read-ahead measured slower (docs/checkpoint.md, "Performance").
        """
        self.pread(view, self.pos)
        self.hash_bytes(view)

    def hash_bytes(self, data: memoryview) -> None:
        """Hash the next ``len(data)`` bytes of the file, already read (by `ItemStream`) into ``data``."""
        self.hasher.update(data)
        self.pos += data.nbytes

    def skip_to(self, offset: int) -> None:
        """Read (and hash) up to ``offset``: bytes this rank does not use still belong to the checksum."""
        if offset < self.pos:
            raise CheckpointError(f"file {self.name}: items overlap at byte {offset} (corrupt metadata)")
        if self._scratch is None and offset > self.pos:
            self._scratch = bytearray(min(READ_CHUNK, max(offset - self.pos, 1 << 16)))
        while self.pos < offset:
            assert self._scratch is not None  # invariant: allocated above whenever there is a gap
            self.read_into(memoryview(self._scratch)[: min(len(self._scratch), offset - self.pos)])

    def finish(self) -> None:
        """Read to the end and compare the checksum; `CheckpointError` naming the file when it differs."""
        self.skip_to(self.entry.size)
        if os.pread(self.fd, 1, self.entry.size):
            raise CheckpointError(f"file {self.name} grew while read (manifest says {self.entry.size} bytes)")
        digest = self.hasher.hexdigest()
        if digest != self.entry.checksum:
            raise CheckpointError(f"file {self.name} checksum {digest} != manifest {self.entry.checksum} (corrupt)")


class SeekableReader(io.RawIOBase):
    """A read-only, seekable raw file of ``size`` bytes; subclasses provide ``readinto`` from ``self._pos``."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0

    @property
    def size(self) -> int:
        """Bytes in this file."""
        return self._size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(base + offset, 0)
        return self._pos


class ItemStream(SeekableReader):
    """The bytes ``[offset, offset + length)`` of a `HashedFile` as a seekable file (see module doc).

    Call `close_item` after ``torch.load``: it hashes what the load did not read.
    """

    def __init__(self, file: HashedFile, offset: int, length: int) -> None:
        super().__init__(length)
        self._file = file
        self._offset = offset
        self._kept: list[tuple[int, bytes]] = []
        """(file offset, bytes) read ahead of the checksum or small enough to be read again."""

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(min(out.nbytes, self._size - self._pos), 0)
        if not n:
            return 0
        at, target, file = self._offset + self._pos, out[:n], self._file
        if self._from_kept(at, target):
            pass
        elif at >= file.pos and (at == file.pos or n >= SMALL_READ):  # in order: straight into the caller
            self._advance(at)
            file.read_into(target)
            if n < SMALL_READ:
                self._kept.append((at, bytes(target)))
        elif at >= file.pos:  # a small read ahead of the checksum: kept, hashed when the checksum gets there
            file.pread(target, at)
            self._kept.append((at, bytes(target)))
        else:
            # Behind the checksum and not kept: a large range read a second time. torch.load does not do
            # this; if it did, these bytes were hashed when first read and the file has not changed since.
            file.pread(target, at)
        self._pos += n
        return n

    def _from_kept(self, at: int, target: memoryview) -> bool:
        for start, data in self._kept:
            if start <= at and at + target.nbytes <= start + len(data):
                target[:] = data[at - start : at - start + target.nbytes]
                return True
        return False

    def _advance(self, to: int) -> None:
        """Hash up to file offset ``to``: from kept bytes where the load read them, else from the file."""
        file = self._file
        while file.pos < to:
            cur = file.pos
            kept = next(((s, d) for s, d in self._kept if s <= cur < s + len(d)), None)
            if kept is not None:
                start, data = kept
                file.hash_bytes(memoryview(data)[cur - start : min(start + len(data), to) - start])
                continue
            gap_end = min([s for s, _ in self._kept if s > cur] + [to])
            if gap_end - cur < SMALL_READ:  # zip padding between records: small, kept in case it is read
                gap = bytearray(gap_end - cur)
                file.read_into(memoryview(gap))
                self._kept.append((cur, bytes(gap)))
            else:
                file.skip_to(gap_end)

    def close_item(self) -> None:
        """Hash the rest of the item (what the load did not read, or all of it after a failed load)."""
        self._advance(self._offset + self._size)
