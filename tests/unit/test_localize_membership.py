"""A rank lost inside a tensor-parallel sub-group collective, on real gloo dumps (tests/unit/recorded/
subgroup-crash-*, recorded by tests/dist/record_subgroup_dumps.py): gloo names no group members, the dead rank
left no dump, so it is in no sub-group's entries; the verdict must still name it, with its peers waiting."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainguard.localize import diagnose_path

RECORDED = Path(__file__).with_name("recorded")
CASES = sorted(RECORDED.glob("subgroup-crash-tp*-dead*"))


def _case(path: Path) -> tuple[int, int]:
    tp, dead = path.name.removeprefix("subgroup-crash-tp").split("-dead")
    return int(tp), int(dead)


def test_every_layout_and_position_is_recorded() -> None:
    got = {_case(p) for p in CASES}
    assert {t for t, _ in got} == {2, 4}  # 4 groups of 2 and 2 groups of 4
    assert {d % t for t, d in got} >= {0, 1} and len(got) >= 6
    for p in CASES:
        _, dead = _case(p)
        assert not (p / f"fr_trace_rank_{dead}.pkl").exists() and len(list(p.glob("*.pkl"))) == 7


@pytest.mark.parametrize("path", CASES, ids=[p.name for p in CASES])
def test_the_rank_without_a_dump_is_the_crash_culprit(path: Path) -> None:
    tp, dead = _case(path)
    hosts = {r: f"node-{r // 4}" for r in range(8)}
    rep = diagnose_path(path, hosts, world_size=8)
    assert rep.verdict == "crash", rep.explanation
    assert rep.culprit_ranks == (dead,) and rep.culprit_hosts == (f"node-{dead // 4}",)
    group = set(range(dead - dead % tp, dead - dead % tp + tp))
    top = rep.problems[0]
    assert set(top.group_ranks) == group and top.process_group != "0"
    assert top.waiting_ranks == tuple(sorted(group - {dead}))  # the peers wait, they are not culprits
    world = next(p for p in rep.problems if p.process_group == "0")
    assert world.verdict == "hang" and world.culprit_ranks == (dead,)
    assert set(world.waiting_ranks) == set(range(8)) - group
    assert world.blocked_by == (0,)
    assert all(set(p.culprit_ranks) == {dead} for p in rep.problems)
    assert "every blocked group has in common" in world.explanation


@pytest.mark.parametrize("path", CASES[:2], ids=[p.name for p in CASES[:2]])
def test_the_snapshot_before_the_fault_is_healthy(path: Path) -> None:
    rep = diagnose_path(path / "healthy", world_size=8)
    assert rep.verdict == "healthy", rep.explanation


def test_without_the_world_size_a_lost_last_rank_is_not_invented(tmp_path: Path) -> None:
    # rank 7 is the last rank: nothing but the world size says it exists, so no group is completed with it
    path = RECORDED / "subgroup-crash-tp4-dead7"
    rep = diagnose_path(path)
    assert 7 not in rep.culprit_ranks
    assert diagnose_path(path, world_size=8).culprit_ranks == (7,)


def test_a_dumped_peer_is_never_placed_in_a_hole(tmp_path: Path) -> None:
    # the same job with the dead rank's dump present (taken from the healthy snapshot): the sub-group is
    # complete, so nothing is inferred and rank 5 is no longer a rank without a dump
    src = RECORDED / "subgroup-crash-tp4-dead5"
    for f in src.glob("*.pkl"):
        shutil.copy(f, tmp_path / f.name)
    shutil.copy(src / "healthy" / "fr_trace_rank_5.pkl", tmp_path / "fr_trace_rank_5.pkl")
    rep = diagnose_path(tmp_path, world_size=8)
    assert rep.missing_ranks == ()
    assert rep.verdict != "crash"


def test_a_strided_layout_is_completed_too(tmp_path: Path) -> None:
    # Dumps carry no rank of their own (the file name gives it): renaming the recorded files r -> 2*(r % 4) + r // 4
    # turns groups [0..3] and [4..7] into [0, 2, 4, 6] and [1, 3, 5, 7], the dead rank 5 into 3.
    src = RECORDED / "subgroup-crash-tp4-dead5"
    for f in src.glob("fr_trace_rank_*.pkl"):
        r = int(f.stem.rsplit("_", 1)[1])
        shutil.copy(f, tmp_path / f"fr_trace_rank_{2 * (r % 4) + r // 4}.pkl")
    rep = diagnose_path(tmp_path, world_size=8)
    assert rep.verdict == "crash" and rep.culprit_ranks == (3,), rep.explanation
    assert rep.problems[0].group_ranks == (1, 3, 5, 7) and rep.problems[0].waiting_ranks == (1, 5, 7)
