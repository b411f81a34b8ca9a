"""Checkpoints that never lose a step: DCP shards, checksummed manifest, atomic commit, verified restore.

Public names: `Checkpointer`, `IntervalPolicy`, `CheckpointError`, `latest_step`, `WriteHooks`,
`DiskQuota` (test seams) and `RANK_LOCAL_KEY`. See docs/checkpoint.md.
"""

from __future__ import annotations

from trainguard.checkpoint.checkpointer import Checkpointer
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.interval import IntervalPolicy, daly_interval, young_interval
from trainguard.checkpoint.manifest import Manifest, latest_step, read_manifest
from trainguard.checkpoint.structure import RANK_LOCAL_KEY
from trainguard.checkpoint.writer import DiskQuota, WriteHooks

__all__ = [
    "RANK_LOCAL_KEY",
    "CheckpointError",
    "Checkpointer",
    "DiskQuota",
    "IntervalPolicy",
    "Manifest",
    "WriteHooks",
    "daly_interval",
    "latest_step",
    "read_manifest",
    "young_interval",
]
