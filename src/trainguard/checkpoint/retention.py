"""Which checkpoints to keep: the last K, every M-th step, and always the newest verified one.

Deletion first renames ``step-<N>`` to a hidden name, so a half-deleted checkpoint is never seen as
committed; then the hidden directory is removed.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from trainguard.checkpoint.manifest import STEP_DIR, fsync_dir, step_dir

log = logging.getLogger(__name__)

HIDDEN_PREFIXES = (".staging-", ".deleting-", ".replaced-")


def select_deletions(
    steps: Iterable[int], *, keep_last: int, keep_every: int | None, protect: Iterable[int] = ()
) -> list[int]:
    """Steps to delete: all but the newest ``keep_last``, multiples of ``keep_every`` and ``protect``."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    if keep_every is not None and keep_every < 1:
        raise ValueError(f"keep_every must be >= 1, got {keep_every}")
    ordered = sorted(set(steps), reverse=True)
    keep = set(ordered[:keep_last]) | set(protect)
    if keep_every:
        keep |= {s for s in ordered if s % keep_every == 0}
    return sorted(s for s in ordered if s not in keep)


def apply_retention(
    directory: Path, *, keep_last: int, keep_every: int | None, protect: Iterable[int], active: str = ""
) -> list[int]:
    """Delete what `select_deletions` names among ``step-<N>`` dirs and stale hidden dirs; returns deleted steps.

    ``active`` is the name of a staging directory in use, which is left alone.
    """
    # follow_symlinks=False: a step-N symlink is never a checkpoint of ours (restore rejects it), and a
    # hidden symlink is unlinked below, never what it points to.
    steps = [
        int(m.group(1))
        for e in os.scandir(directory)
        if (m := STEP_DIR.match(e.name)) and e.is_dir(follow_symlinks=False)
    ]
    doomed = select_deletions(steps, keep_last=keep_last, keep_every=keep_every, protect=protect)
    for step in doomed:
        hidden = directory / f".deleting-step-{step}-{os.getpid()}"
        try:
            os.rename(step_dir(directory, step), hidden)
        except OSError as exc:
            log.warning("cannot retire checkpoint step-%d: %s", step, exc)
    if doomed:
        fsync_dir(directory)
    for entry in os.scandir(directory):
        if not entry.name.startswith(HIDDEN_PREFIXES) or entry.name == active:
            continue
        if entry.is_symlink():
            os.unlink(entry.path)
        elif entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
    return doomed
