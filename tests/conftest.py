"""Fixtures shared by every test directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.core.rundir import RunDir


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    """An empty run directory skeleton."""
    return RunDir(tmp_path / "run").create()
