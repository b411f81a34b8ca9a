"""Names that become paths are checked in one place; run ids do not collide; run folders are 0750."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from trainguard.core import names
from trainguard.core.names import check_name, check_rank, new_run_id
from trainguard.core.rundir import RunDir
from trainguard.errors import UsageError


@pytest.mark.parametrize("good", ["node1", "agent-gpu-node-0412", "rank-3", "a", "x@y.z_w", "A" * 128])
def test_good_names_pass(good: str) -> None:
    assert check_name("node id", good) == good


@pytest.mark.parametrize("bad", ["../../../../X", "..", "a..b", "a/b", "/abs", ".hidden", "-flag", "", "a b",
                                 "a\nb", "A" * 129, "é", "a\\b", 3, None])
def test_bad_names_are_one_line_usage_errors(bad: object) -> None:
    with pytest.raises(UsageError) as info:
        check_name("node id", bad)
    msg = str(info.value)
    assert msg.startswith("bad node id") and "\n" not in msg and len(msg) < 250


@pytest.mark.parametrize(("value", "rank"), [(0, 0), ("7", 7), (9_999_999, 9_999_999)])
def test_ranks(value: object, rank: int) -> None:
    assert check_rank(value) == rank


@pytest.mark.parametrize("bad", [-1, 10_000_000, "1e3", "-1", "", "0x1", True, 1.0, "../1", None])
def test_bad_ranks(bad: object) -> None:
    with pytest.raises(UsageError, match="bad rank"):
        check_rank(bad)


def test_new_run_ids_are_unique_within_one_second_and_sortable() -> None:
    ids = {new_run_id(now=1_800_000_000.0) for _ in range(500)}
    assert len(ids) == 500
    for i in ids:
        assert re.fullmatch(r"run-\d{8}-\d{6}-[0-9a-f]{6}", i)
        check_name("run id", i)
    assert new_run_id(now=1_800_000_000.0) < new_run_id(now=1_800_000_001.0)



def test_a_repeated_random_draw_in_the_same_second_is_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # The 24 random bits repeat among 500 ids about once in 135 tries; the old code then returned the repeat.
    draws = iter(["00abcd", "00abcd", "00abcd", "ffffff"])
    monkeypatch.setattr(names.secrets, "token_hex", lambda n: next(draws))
    first = new_run_id(now=1_800_000_100.0)
    second = new_run_id(now=1_800_000_100.0)
    assert first.endswith("-00abcd") and second.endswith("-ffffff")
    # in a later second the same random part is a different id, so it is not drawn again
    monkeypatch.setattr(names.secrets, "token_hex", lambda n: "00abcd")
    assert new_run_id(now=1_800_000_101.0).endswith("-00abcd")


def test_the_default_run_folder_is_never_one_another_process_already_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from trainguard.cli import run as cli_run
    from trainguard.cli.run_rendezvous import Rendezvous

    (tmp_path / "runs" / "run-20270115-080000-00abcd").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    draws = iter(["run-20270115-080000-00abcd", "run-20270115-080000-ffffff"])
    monkeypatch.setattr(names, "new_run_id", lambda: next(draws))
    args = argparse.Namespace(rdzv_id=None, run_dir=None)
    run_dir, rdzv_id = cli_run._run_dir_and_id(args, (1, 1), Rendezvous("c10d", "127.0.0.1:0", 0, {}))
    assert run_dir == Path("runs") / "run-20270115-080000-ffffff" and rdzv_id == run_dir.name


def test_writer_names_that_escape_the_run_folder_are_refused(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run").create()
    with pytest.raises(UsageError, match="bad event writer name"):
        rd.writer("../../../../X")
    with pytest.raises(UsageError):
        rd.writer("agent-..")
    assert not (tmp_path / "X.jsonl").exists()
    with rd.writer("agent-node1") as w:
        assert w.path.parent == rd.events_dir


def test_run_folders_are_0750_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        rd = RunDir(tmp_path / "runs" / "r1").create()
    finally:
        os.umask(old)
    for d in (tmp_path / "runs", rd.root, rd.events_dir, rd.checkpoints_dir, rd.root / "diagnostics", rd.root / "logs"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o750, d
    # an existing folder keeps the mode its owner gave it
    mine = tmp_path / "mine"
    mine.mkdir()
    mine.chmod(0o755)
    RunDir(mine).create()
    assert stat.S_IMODE(mine.stat().st_mode) == 0o755
    assert stat.S_IMODE((mine / "events").stat().st_mode) == 0o750
