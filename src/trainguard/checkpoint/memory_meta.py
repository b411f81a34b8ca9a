"""The description of one rank's memory-tier copy (`CopyMeta`): where each tensor lies and the blob's checksum.

Pure (no torch): the holder process reads and writes these without importing torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainguard.checkpoint.errors import CheckpointError

FORMAT = "trainguard-memory-checkpoint"
ALIGN = 64
MAX_META_BYTES = 64 << 20


@dataclass(frozen=True)
class Entry:
    """One tensor of a copy."""

    key: str
    """Flattened state key."""
    dtype: str
    """torch dtype name without ``torch.`` (``float32``)."""
    shape: tuple[int, ...]
    """Tensor shape."""
    offset: int
    """Byte offset in the blob (a multiple of `ALIGN`)."""
    nbytes: int
    """Bytes of the tensor."""


@dataclass(frozen=True)
class CopyMeta:
    """What a memory copy holds and how it is verified."""

    step: int
    """Training step saved."""
    rank: int
    """Rank whose state it is."""
    world_size: int
    """Ranks of the job that saved it."""
    algorithm: str
    """Checksum algorithm (``xxh3_64`` or ``crc32``)."""
    checksum: str
    """Hex digest of the blob's first ``size`` bytes."""
    size: int
    """Bytes of the blob."""
    entries: tuple[Entry, ...]
    """The tensors, in the order of the state."""
    objects: tuple[int, int]
    """(offset, bytes) of the ``torch.save`` blob of the non-tensor values."""

    def to_bytes(self) -> bytes:
        data = {
            "format": FORMAT, "step": self.step, "rank": self.rank, "world_size": self.world_size,
            "algorithm": self.algorithm, "checksum": self.checksum, "size": self.size,
            "entries": [[e.key, e.dtype, list(e.shape), e.offset, e.nbytes] for e in self.entries],
            "objects": list(self.objects),
        }
        return json.dumps(data).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> CopyMeta:
        """Parse and bound-check; `CheckpointError` for anything malformed (a damaged or planted file)."""
        if len(raw) > MAX_META_BYTES:
            raise CheckpointError("memory checkpoint description is too large")
        try:
            data = json.loads(raw)
            if data.get("format") != FORMAT:
                raise ValueError("not a memory checkpoint")
            size = _count(data["size"])
            entries = tuple(
                Entry(str(k), str(d), tuple(_count(n) for n in s), _count(o), _count(b))
                for k, d, s, o, b in data["entries"]
            )
            objects = (_count(data["objects"][0]), _count(data["objects"][1]))
            for entry in entries:
                if entry.offset + entry.nbytes > size:
                    raise ValueError(f"tensor {entry.key} lies past the end of the copy")
            if sum(objects) > size:
                raise ValueError("objects lie past the end of the copy")
            return cls(
                step=_count(data["step"]), rank=_count(data["rank"]), world_size=_count(data["world_size"]),
                algorithm=str(data["algorithm"]), checksum=str(data["checksum"]), size=size,
                entries=entries, objects=objects,
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise CheckpointError(f"malformed memory checkpoint description: {exc}") from None


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a count")
    return value
