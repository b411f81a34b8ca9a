"""The --inject grammar and the in-rank injector's once-per-run rule (no processes needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.chaos import faults as chaos
from trainguard.errors import UsageError


def test_grammar_parses_every_kind_and_round_trips() -> None:
    spec = ("crash@step=30,rank=1;exit@step=4,code=3;hang@step=60,rank=2;hang-in-collective@step=7;"
            "slow@step=0,rank=3,factor=1.3;desync@step=9,rank=1;unhealthy@node=n1,attempt=2")
    faults = chaos.parse_spec(spec)
    assert [f.kind for f in faults] == ["crash", "exit", "hang", "hang-in-collective", "slow", "desync",
                                        "unhealthy"]
    assert faults[0].step == 30 and faults[0].rank == 1
    assert faults[1].params == {"code": 3} and faults[4].params == {"factor": 1.3}
    assert faults[6].node == "n1" and faults[6].attempt == 2
    assert chaos.parse_spec(chaos.format_spec(faults)) == faults
    assert chaos.parse_spec("none") == [] and chaos.parse_spec("") == [] and chaos.parse_spec(None) == []


@pytest.mark.parametrize("bad", [
    "explode@step=1", "crash", "crash@rank=1", "crash@step=x", "crash@step=-1", "crash@step=1,color=red",
    "crash@step=1,step=2", "slow@step=1,factor=0.5", "slow@step=1,factor=nan", "crash@step", "unhealthy@attempt=1",
])
def test_grammar_rejects_anything_else_with_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="--inject"):
        chaos.parse_spec(bad)


def test_a_fault_fires_once_per_run_and_only_on_its_rank(tmp_path: Path) -> None:
    fired: list[tuple[str, int]] = []
    faults = chaos.parse_spec("slow@step=3,rank=1,factor=1.5;slow@step=2,rank=0,attempt=1")

    def injector(rank: int, attempt: int) -> chaos.Injector:
        return chaos.Injector(faults, rank=rank, attempt=attempt, marker_dir=tmp_path,
                              record=lambda f, step: fired.append((f.kind, step)))

    other = injector(0, 0)
    for step in range(1, 6):
        other.on_step_start(step)
    assert fired == []  # rank 0's fault is restricted to attempt 1
    first = injector(1, 0)
    for step in range(1, 6):
        first.on_step_start(step)
    assert fired == [("slow", 3)]
    again = injector(1, 1)  # a restart re-executes step 3: the fault does not fire twice
    for step in range(2, 6):
        again.on_step_start(step)
    assert fired == [("slow", 3)]
    assert (tmp_path / "fired-0").exists()
