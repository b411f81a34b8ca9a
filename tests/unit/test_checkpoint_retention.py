"""Retention: keep the last K, every M-th, and the protected newest verified checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.checkpoint.retention import apply_retention, select_deletions


def test_keeps_last_k_and_every_mth() -> None:
    steps = range(10, 130, 10)
    assert select_deletions(steps, keep_last=2, keep_every=50) == [10, 20, 30, 40, 60, 70, 80, 90]
    assert select_deletions(steps, keep_last=20, keep_every=None) == []


def test_protected_step_survives_even_when_newer_ones_exist() -> None:
    # step 40 is the newest verified one; 50 and 60 exist (e.g. from an abandoned timeline)
    assert 40 not in select_deletions([10, 20, 30, 40, 50, 60], keep_last=1, keep_every=None, protect=[40])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        select_deletions([1], keep_last=0, keep_every=None)
    with pytest.raises(ValueError):
        select_deletions([1], keep_last=1, keep_every=0)


def test_apply_retention_hides_then_removes_and_cleans_stale_staging(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / "manifest.json").write_text("{}")
    (tmp_path / ".staging-step-9-abc").mkdir()
    (tmp_path / ".staging-step-5-live").mkdir()
    (tmp_path / ".rejected-step-7-xyz").mkdir()
    deleted = apply_retention(tmp_path, keep_last=2, keep_every=None, protect=[4], active=".staging-step-5-live")
    assert deleted == [1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".rejected-step-7-xyz",  # evidence is kept
        ".staging-step-5-live",
        "step-3",
        "step-4",
    ]
