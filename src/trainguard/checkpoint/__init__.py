"""Checkpoints that never lose a step: DCP shards, checksummed manifest, atomic commit, one-read verified restore.

Public names: `Checkpointer`, `CheckpointConfig`, `IntervalPolicy`, `CheckpointError`, `latest_step`,
`read_manifest`, `Manifest`, `WriteHooks` and `DiskQuota` (test seams) and `RANK_LOCAL_KEY`. The first
three are also ``trainguard.Checkpointer`` etc. See docs/checkpoint.md. Names are imported on first use,
so that the memory tier's holder process (`trainguard.checkpoint.memory_holder`) starts without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainguard.checkpoint.checkpointer import Checkpointer
    from trainguard.checkpoint.config import CheckpointConfig
    from trainguard.checkpoint.errors import CheckpointError
    from trainguard.checkpoint.interval import IntervalPolicy
    from trainguard.checkpoint.manifest import Manifest, latest_step, read_manifest
    from trainguard.checkpoint.structure import RANK_LOCAL_KEY
    from trainguard.checkpoint.writer import DiskQuota, WriteHooks

_LAZY: dict[str, str] = {
    "RANK_LOCAL_KEY": "trainguard.checkpoint.structure",
    "CheckpointConfig": "trainguard.checkpoint.config",
    "CheckpointError": "trainguard.checkpoint.errors",
    "Checkpointer": "trainguard.checkpoint.checkpointer",
    "DiskQuota": "trainguard.checkpoint.writer",
    "IntervalPolicy": "trainguard.checkpoint.interval",
    "Manifest": "trainguard.checkpoint.manifest",
    "WriteHooks": "trainguard.checkpoint.writer",
    "latest_step": "trainguard.checkpoint.manifest",
    "read_manifest": "trainguard.checkpoint.manifest",
}

__all__ = [
    "RANK_LOCAL_KEY",
    "CheckpointConfig",
    "CheckpointError",
    "Checkpointer",
    "DiskQuota",
    "IntervalPolicy",
    "Manifest",
    "WriteHooks",
    "latest_step",
    "read_manifest",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainguard.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
