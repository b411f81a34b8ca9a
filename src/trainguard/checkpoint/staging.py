"""Host memory a restore loads into before the checkpoint is verified: one mapping, on huge pages if allowed.

Staging the whole state is what lets a restore verify every byte before the model changes; its cost is
the first touch of that memory. Carved out of one anonymous mapping advised ``MADV_HUGEPAGE``, the
kernel faults it in 2 MiB pages instead of 4 KiB ones (about 3x faster to fill here); without
transparent huge pages it is ordinary memory. The arena is kept for the checkpointer's next restore.
"""

from __future__ import annotations

import contextlib
import mmap
from typing import Any

import torch

_ALIGN = 64
"""Offset alignment of each tensor in the mapping (any dtype's, and a cache line)."""


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _arena(nbytes: int) -> torch.Tensor:
    """``nbytes`` of fresh anonymous memory as a uint8 tensor (the tensor keeps the mapping alive)."""
    region = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):  # THP off in this kernel: ordinary pages
            region.madvise(advice)
    return torch.frombuffer(region, dtype=torch.uint8)


class StagingArena:
    """The host memory restores load into, kept from one restore to the next.

    A later restore (an in-process restart) then writes into pages already faulted in. It is one copy
    of the state's plain tensors; `release` (the checkpointer's ``close``) gives it back.
    """

    def __init__(self) -> None:
        self._arena: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self._arena is None else self._arena.numel()

    def release(self) -> None:
        self._arena = None

    def _memory(self, nbytes: int) -> torch.Tensor:
        if self._arena is None or self._arena.numel() < nbytes:
            self._arena = None  # the old mapping goes before the new one is faulted in
            self._arena = _arena(nbytes)
        return self._arena

    def state(self, flat: dict[str, Any]) -> dict[str, Any]:
        """Tensors shaped like ``flat``'s to load into: plain tensors share the arena, a subclass (DTensor)
        gets ``empty_like`` (its own placement), anything else is passed through. Valid until the next call."""
        plain = {fqn: v for fqn, v in flat.items() if type(v) is torch.Tensor}
        total = sum(_aligned(v.numel() * v.element_size()) for v in plain.values())
        arena = self._memory(total) if plain else None
        staged: dict[str, Any] = {}
        at = 0
        for fqn, value in flat.items():
            if fqn in plain:
                assert arena is not None  # invariant: allocated whenever there is a plain tensor
                nbytes = value.numel() * value.element_size()
                staged[fqn] = arena[at : at + nbytes].view(value.dtype).view(value.shape)
                at += _aligned(nbytes)
            elif isinstance(value, torch.Tensor):
                staged[fqn] = torch.empty_like(value)
            else:
                staged[fqn] = value
        return staged
