"""Checkpoints that never lose a step: DCP shards, checksummed manifest, atomic commit, one-read verified restore.

Public names: `Checkpointer`, `CheckpointConfig`, `IntervalPolicy`, `CheckpointError`, `latest_step`,
`read_manifest`, `Manifest`, `WriteHooks` and `DiskQuota` (test seams) and `RANK_LOCAL_KEY`. The first
three are also ``trainguard.Checkpointer`` etc. See docs/checkpoint.md.
"""

from __future__ import annotations

from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.checkpoint.config import CheckpointConfig
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.interval import IntervalPolicy
from trainguard.checkpoint.manifest import Manifest, latest_step, read_manifest
from trainguard.checkpoint.structure import RANK_LOCAL_KEY
from trainguard.checkpoint.writer import DiskQuota, WriteHooks

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
