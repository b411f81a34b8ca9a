"""Page-cache eviction shared by the benchmarks that time reads from disk (checkpoint.py, gpu_check.py)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def evict(paths: Iterable[Path]) -> None:
    """Write the files out and drop them from the page cache (no root needed), so the next read hits the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def evict_tree(directory: Path) -> None:
    """`evict` every file below ``directory``."""
    evict(p for p in directory.rglob("*") if p.is_file())
