"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from trainguard.core.rundir import RunDir

if TYPE_CHECKING:
    from tests.postgres_server import PostgresServer

# Property tests check behaviour, not speed: no per-example deadline (on a busy machine one slow example
# would make Hypothesis call the test flaky). They draw the same examples every run, so a red run can be
# reproduced; TRAINGUARD_HYPOTHESIS=explore draws new ones.
settings.register_profile("steady", deadline=None, derandomize=True)
settings.register_profile("explore", deadline=None)
settings.load_profile("explore" if os.environ.get("TRAINGUARD_HYPOTHESIS") == "explore" else "steady")


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


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One private PostgreSQL server for the session (tests/postgres_server.py); fails without the binaries."""
    from tests.postgres_server import start_server

    server = start_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty fleet database: a SQLite file, or a new database on the session's PostgreSQL server
    (its URL). Tests taking it run once per engine."""
    if request.param == "sqlite":
        return str(tmp_path / "fleet.db")
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.url(server.new_database())
