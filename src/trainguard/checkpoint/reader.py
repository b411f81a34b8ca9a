"""DCP storage reader that verifies a checkpoint while loading it, so a restore reads every byte once.

`VerifyingReader` is a `torch.distributed.checkpoint.FileSystemReader` whose ``read_data`` reads each
file it needs from start to end, once, hashing every byte against the manifest's checksum while
handing DCP the items it asked for. The manifest has one checksum per whole file, so a file is read
whole even when this rank needs only some of its items (a resharded load, another rank's rank-local
state); in the usual layouts (each rank loads its own shard, or replicated state every rank needs)
that costs nothing extra. ``.metadata`` is verified before it is unpickled.

Items reach DCP before their file's checksum is known, so the caller must load into staging buffers
and trust them only once every file verified on every rank (`trainguard.checkpoint.restore` does).
Pickled objects (``BYTE_IO`` items) are unpickled only after their file verified.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.hashedfile import HashedFile, ItemStream, SeekableReader
from trainguard.checkpoint.manifest import DCP_METADATA, MAX_MANIFEST_BYTES, FileEntry, Manifest
from trainguard.checkpoint.safefs import open_checkpoint_dir, open_regular
from trainguard.torch_api.serialization import saved_tensor_layout

log = logging.getLogger(__name__)


def _narrow(tensor: torch.Tensor, offsets: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
    """The part of a saved chunk this read item covers (DCP's offsets are per dimension)."""
    for dim, (offset, length) in enumerate(zip(offsets, lengths, strict=True)):
        if offset != 0 or length != tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    return tensor


def _whole_cpu_target(item: ReadItem, target: torch.Tensor) -> bool:
    """Whether ``item`` is all of ``target``, a plain contiguous host tensor (its memory can take the bytes)."""
    return (
        type(target) is torch.Tensor
        and target.device.type == "cpu"
        and target.is_contiguous()
        and target.numel() > 0
        and not any(item.dest_offsets)
        and not any(item.storage_offsets)
        and list(item.lengths) == list(target.size())
    )


def _same_layout(saved: torch.Tensor, target: torch.Tensor) -> bool:
    return saved.size() == target.size() and saved.dtype == target.dtype and saved.is_contiguous()


class _ViewFile(SeekableReader):
    """A read-only, seekable file over bytes already in memory (``torch.load`` reads its data with readinto)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__(view.nbytes)
        self._view = view

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(min(out.nbytes, self._view.nbytes - self._pos), 0)
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n


class _MetadataFS(FileSystem):
    """Hands DCP's ``read_metadata`` the verified bytes of ``.metadata`` (it unpickles them)."""

    def __init__(self, owner: VerifyingReader) -> None:
        self._owner = owner

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        name = os.path.basename(os.fspath(path))
        if "r" not in mode or name != DCP_METADATA:
            raise CheckpointError(f"file {name} is not read through the metadata path of a trainguard checkpoint")
        yield io.BytesIO(self._owner.read_verified(name))


class VerifyingReader(FileSystemReader):
    """FileSystemReader of one committed checkpoint that checks every file it reads against ``manifest``."""

    def __init__(self, path: str | os.PathLike[str], manifest: Manifest) -> None:
        super().__init__(path)
        self.fs = _MetadataFS(self)
        self.manifest = manifest
        self.bytes_read = 0
        """Bytes this reader read from the checkpoint (each once)."""
        self._buffer: torch.Tensor | None = None

    def _entry(self, name: str) -> FileEntry:
        entry = self.manifest.files.get(name)
        if entry is None:
            raise CheckpointError(f"file {name!r:.80} is not listed in the manifest")
        return entry

    def read_verified(self, name: str) -> bytes:
        """All of a small file (``.metadata``), verified against the manifest before anyone parses it."""
        entry = self._entry(name)
        if entry.size > MAX_MANIFEST_BYTES:
            raise CheckpointError(f"file {name} of {entry.size} bytes is too large to hold in memory")
        buf = bytearray(entry.size)
        with open_checkpoint_dir(self.path) as dir_fd, open_regular(dir_fd, name, f"file {name}") as (fd, size):
            if size != entry.size:
                raise CheckpointError(f"file {name} has {size} bytes, manifest says {entry.size}")
            reader = HashedFile(fd, name, entry, self.manifest.checksum_algorithm)
            reader.read_into(memoryview(buf))
            reader.finish()
        self.bytes_read += entry.size
        return bytes(buf)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        with open_checkpoint_dir(self.path) as dir_fd:
            for name, items in per_file.items():
                entry = self._entry(name)
                with open_regular(dir_fd, name, f"file {name}") as (fd, size):
                    if size != entry.size:
                        raise CheckpointError(f"file {name} has {size} bytes, manifest says {entry.size}")
                    self._read_file(HashedFile(fd, name, entry, self.manifest.checksum_algorithm), items, planner)
                self.bytes_read += entry.size
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_file(self, reader: HashedFile, items: list[ReadItem], planner: LoadPlanner) -> None:
        """One pass over a file: items in offset order, tensors handed over as they arrive."""
        by_range: dict[tuple[int, int], list[ReadItem]] = {}
        for item in items:
            info = self.storage_data[item.storage_index]
            by_range.setdefault((info.offset, info.length), []).append(item)
        deferred: list[tuple[ReadItem, io.BytesIO]] = []
        failure: BaseException | None = None
        for (offset, length), same in sorted(by_range.items()):
            if offset + length > reader.entry.size:
                raise CheckpointError(f"file {reader.name}: an item ends past its end (corrupt metadata)")
            reader.skip_to(offset)
            if len(same) == 1 and self._streamable(same[0]):
                # The common case: one tensor, no transform. Its data goes straight from the file into
                # DCP's target (or torch.load's buffer), hashed on the way.
                stream = ItemStream(reader, offset, length)
                if failure is None:
                    failure = self._try_load(same[0], stream, planner, direct=True)
                stream.close_item()
                continue
            view = self._scratch(length)
            reader.read_into(view)
            for item in same:
                if item.type == LoadItemType.BYTE_IO:  # unpickled only once the file verified
                    deferred.append((item, io.BytesIO(view)))
                elif failure is None:
                    failure = self._try_load(item, _ViewFile(view), planner)
        reader.finish()
        if failure is not None:
            raise CheckpointError(f"file {reader.name}: {failure.__class__.__name__}: {failure}") from failure
        for item, data in deferred:
            planner.load_bytes(item, self._transformed(item, data))

    def _try_load(
        self, item: ReadItem, raw: io.IOBase, planner: LoadPlanner, *, direct: bool = False
    ) -> BaseException | None:
        """`_load_tensor` (after `_read_direct`, if ``direct``), its exception returned instead of raised.

        A damaged tensor may fail to parse before the checksum says why: the caller keeps reading, so
        that the checksum mismatch is the error reported.
        """
        try:
            target = planner.resolve_tensor(item).detach()
            if not (direct and isinstance(raw, ItemStream) and self._read_direct(item, raw, target)):
                self._load_tensor(item, raw, target)
            planner.commit_tensor(item, target)
        except Exception as exc:
            return exc
        return None

    @staticmethod
    def _read_direct(item: ReadItem, stream: ItemStream, target: torch.Tensor) -> bool:
        """Read the saved tensor's bytes straight into ``target`` when they are all of it; False (nothing
        read into ``target``, ``stream`` rewound) when it needs ``torch.load``: a chunk, another layout."""
        if not _whole_cpu_target(item, target):
            return False
        try:
            layout = saved_tensor_layout(stream)  # reads the item's small records only
        except Exception:  # any surprise: the full torch.load below decides (and reports damage)
            layout = None
        nbytes = target.numel() * target.element_size()
        if layout is None or not _same_layout(layout[0], target) or layout[1] + nbytes > stream.size:
            stream.seek(0)
            return False
        stream.seek(layout[1])
        view = memoryview(target.view(-1).view(torch.uint8).numpy())
        got = 0
        while got < nbytes:
            n = stream.readinto(view[got:])
            if not n:
                raise CheckpointError(f"{item.storage_index.fqn}: saved data ends early (corrupt metadata)")
            got += n
        return True

    def _streamable(self, item: ReadItem) -> bool:
        return item.type != LoadItemType.BYTE_IO and not self.storage_data[item.storage_index].transform_descriptors

    def _scratch(self, length: int) -> memoryview:
        """A reused, uninitialised buffer of ``length`` bytes (items are parsed out of it before the next read)."""
        if self._buffer is None or self._buffer.numel() < length:
            self._buffer = torch.empty(max(length, 1), dtype=torch.uint8)
        return memoryview(self._buffer.numpy())[:length]

    def _transformed(self, item: ReadItem, raw: io.IOBase) -> io.IOBase:
        info = self.storage_data[item.storage_index]
        raw.seek(0)
        stream = self.transforms.transform_load_stream(item, info.transform_descriptors or (), raw)
        if stream is raw:
            return raw
        return io.BytesIO(stream.read(-1))  # an extension (compression) streams: torch.load needs seeks

    def _load_tensor(self, item: ReadItem, raw: io.IOBase, target: torch.Tensor) -> None:
        tensor: Any = torch.load(self._transformed(item, raw), map_location="cpu", weights_only=True)
        tensor = _narrow(tensor, item.storage_offsets, item.lengths)
        if target.size() != tensor.size():
            saved, wanted = list(tensor.size()), list(target.size())
            raise CheckpointError(f"{item.storage_index.fqn}: saved {saved}, target {wanted}")
        target.copy_(tensor)
