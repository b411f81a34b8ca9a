"""Folders and files keep their documented modes whatever the umask, and planted links are not followed."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.core import safefs
from trainguard.launch import evidence


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0)  # the worst case: a shell with umask 000
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.usefixtures("open_umask")
def test_modes_do_not_follow_the_umask(tmp_path: Path) -> None:
    safefs.make_dirs(tmp_path / "a" / "b")
    assert _mode(tmp_path / "a") == 0o750 and _mode(tmp_path / "a" / "b") == 0o750
    safefs.write_private(tmp_path / "c" / "file.txt", b"x")
    assert _mode(tmp_path / "c") == 0o750 and _mode(tmp_path / "c" / "file.txt") == 0o640
    assert safefs.create_exclusive(tmp_path / "d" / "marker", b"1")
    assert _mode(tmp_path / "d" / "marker") == 0o640


@pytest.mark.usefixtures("open_umask")
def test_evidence_log_tails_are_private(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text("boom\n")
    ev = evidence.gather(tmp_path, tmp_path / "diagnostics" / "attempt-0", {}, {0: [log]})
    tail = tmp_path / "diagnostics" / "attempt-0" / "log_tail_rank_0.txt"
    assert "boom" in tail.read_text() and _mode(tail) == 0o640
    assert _mode(tmp_path / "diagnostics") == 0o750
    seen = tmp_path / "diagnostics" / "attempt-0" / "process_state.json"  # what the agent saw, for diagnose
    assert _mode(seen) == 0o640
    assert ev.files == ["diagnostics/attempt-0/log_tail_rank_0.txt", "diagnostics/attempt-0/process_state.json"]


def test_exclusive_create_wins_once_and_never_follows_a_link(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    marker = tmp_path / "m" / "fired-0"
    marker.parent.mkdir()
    marker.symlink_to(target)
    assert not safefs.create_exclusive(marker, b"overwrite?")
    assert target.read_text() == "keep"
    assert safefs.create_exclusive(tmp_path / "m" / "fired-1", b"1")
    assert not safefs.create_exclusive(tmp_path / "m" / "fired-1", b"2")


def test_write_private_replaces_a_planted_link_instead_of_writing_through_it(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("keep")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "log_tail_rank_0.txt").symlink_to(target)
    safefs.write_private(tmp_path / "d" / "log_tail_rank_0.txt", b"tail")
    assert target.read_text() == "keep"
    assert (tmp_path / "d" / "log_tail_rank_0.txt").read_text() == "tail"


def test_a_log_tail_reads_only_the_end_of_a_big_log(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    with log.open("wb") as f:
        f.seek(64 * 1024 * 1024)  # a 64 MiB sparse file: a tail must not read all of it
        f.write(b"last words\n")
    import tracemalloc

    tracemalloc.start()
    try:
        assert evidence.log_tail(log, 5).endswith("last words")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, peak
    assert evidence.log_tail(tmp_path / "missing.log", 5) == ""
