"""Fixtures shared by every test directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.core.rundir import RunDir


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    """An empty run directory skeleton."""
    return RunDir(tmp_path / "run").create()


# Tests that share a machine-wide resource run in one pytest-xdist worker (``--dist loadgroup``): the Slurm
# daemons of tests/sched (one set per session, fixed state folders), the browser and servers of tests/web, and the
# memory tier's per-user shared-memory folders and holders.
_GROUPS = (("tests/sched/", "slurm"), ("tests/web/", "browser"), ("tests/dist/test_memory_tier", "memory-tier"),
           ("tests/e2e/test_memory_tier", "memory-tier"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        where = Path(str(item.path)).relative_to(root).as_posix()
        group = next((name for prefix, name in _GROUPS if where.startswith(prefix)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
