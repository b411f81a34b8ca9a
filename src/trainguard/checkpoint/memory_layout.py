"""The byte layout of one rank's memory-tier checkpoint: tensors packed at aligned offsets, then the other values.

A copy is a data blob plus a small JSON description (`CopyMeta`): where each tensor lies, its dtype and
shape, and the checksum of the whole blob with the same algorithms as storage checkpoints
(`trainguard.checkpoint.checksum`). Non-tensor values are one ``torch.save`` blob loaded back with
``weights_only=True``, and only after the checksum verified. Nothing here touches a model: `unpack`
returns views that the caller copies in once every rank agreed.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import torch

from trainguard.checkpoint.checksum import new_hasher
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.memory_meta import ALIGN, CopyMeta, Entry


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"memory checkpoint names an unknown dtype {name!r}")
    return dtype


@dataclass(frozen=True)
class Plan:
    """Where `pack` puts each value of a flattened state."""

    entries: tuple[Entry, ...]
    objects_blob: bytes
    objects_offset: int
    size: int


def plan(flat: dict[str, Any]) -> Plan:
    """Lay out ``flat`` (DCP-flattened state): plain tensors at aligned offsets, the rest pickled at the end."""
    entries: list[Entry] = []
    others: dict[str, Any] = {}
    offset = 0
    for key, value in flat.items():
        if isinstance(value, torch.Tensor):
            if type(value) is not torch.Tensor:
                raise CheckpointError(f"the memory tier holds plain tensors only; {key} is a {type(value).__name__}")
            nbytes = value.numel() * value.element_size()
            entries.append(Entry(key, str(value.dtype).removeprefix("torch."), tuple(value.shape), offset, nbytes))
            offset += math.ceil(nbytes / ALIGN) * ALIGN
        else:
            others[key] = value
    buf = io.BytesIO()
    torch.save(others, buf)
    blob = buf.getvalue()
    return Plan(tuple(entries), blob, offset, offset + len(blob))


def pack(flat: dict[str, Any], layout: Plan, target: memoryview) -> None:
    """Copy the state into ``target`` (at least ``layout.size`` writable bytes): the save's one memory copy."""
    with torch.no_grad():
        for entry in layout.entries:
            if entry.nbytes == 0:
                continue
            value = flat[entry.key]
            dest = torch.frombuffer(target, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
            dest.view(value.dtype).view(value.shape).copy_(value)
            del dest
    end = layout.objects_offset + len(layout.objects_blob)
    target[layout.objects_offset : end] = layout.objects_blob


def digest(data: memoryview, algorithm: str) -> str:
    hasher = new_hasher(algorithm)
    hasher.update(data)
    return hasher.hexdigest()


def verify(meta: CopyMeta, data: memoryview, computed: str | None = None) -> str:
    """Why ``data`` is not the copy ``meta`` describes, or ``""`` when its size and checksum match.

    ``computed``: the digest of ``data[:meta.size]`` already taken (while it was received or in a thread)."""
    if len(data) < meta.size:
        return f"memory copy is truncated ({len(data)} of {meta.size} bytes)"
    if computed is None:
        try:
            computed = digest(data[: meta.size], meta.algorithm)
        except ValueError as exc:
            return str(exc)
    if computed != meta.checksum:
        return f"memory copy checksum mismatch ({meta.algorithm} {computed}, expected {meta.checksum})"
    return ""


def check_structure(meta: CopyMeta, flat: dict[str, Any]) -> None:
    """`CheckpointError` when the copy's tensors (keys, dtypes, shapes) differ from the state's; reads no data."""
    tensors = {k for k, v in flat.items() if isinstance(v, torch.Tensor)}
    saved = {e.key: e for e in meta.entries}
    if set(saved) != tensors:
        missing = sorted(tensors - set(saved)) or sorted(set(saved) - tensors)
        raise CheckpointError(f"memory copy does not match the state's tensors (first difference: {missing[0]})")
    for key, entry in saved.items():
        value = flat[key]
        if _dtype(entry.dtype) != value.dtype or entry.shape != tuple(value.shape):
            raise CheckpointError(f"memory copy of {key} is {entry.dtype}{list(entry.shape)}, the state's is "
                                  f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}")


def unpack(meta: CopyMeta, data: memoryview, flat: dict[str, Any]) -> dict[str, Any]:
    """Staged values for ``flat`` from a verified copy (tensor views into ``data``); `CheckpointError` when
    the copy's structure differs from the state's."""
    check_structure(meta, flat)
    tensors = {k for k, v in flat.items() if isinstance(v, torch.Tensor)}
    staged: dict[str, Any] = {}
    for entry in meta.entries:
        key, dtype = entry.key, _dtype(entry.dtype)
        if entry.nbytes == 0:
            staged[key] = torch.empty(entry.shape, dtype=dtype)
        else:
            raw = torch.frombuffer(data, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
            staged[key] = raw.view(dtype).view(entry.shape)
    start, length = meta.objects
    others = torch.load(io.BytesIO(bytes(data[start : start + length])), weights_only=True)
    if not isinstance(others, dict) or set(others) != set(flat) - tensors:
        raise CheckpointError("memory copy does not match the state's non-tensor values")
    staged.update(others)
    return staged
