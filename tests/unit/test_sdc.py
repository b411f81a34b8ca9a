"""The pure SDC logic: fingerprints, the majority vote, the marker, rollback and exclusion decisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.chaos import faults as chaos
from trainguard.errors import UsageError
from trainguard.sdc import verdict as sdc


def test_combine_sees_any_single_change_and_order() -> None:
    base = [10, 20, 30, 40]
    fp = sdc.combine(base)
    for i in range(len(base)):
        for bit in (0, 7, 31, 40):
            changed = list(base)
            changed[i] ^= 1 << bit
            assert sdc.combine(changed) != fp
    assert sdc.combine([20, 10, 30, 40]) != fp  # swapped parameters differ
    assert sdc.combine(base) == fp  # and it is deterministic


@given(st.lists(st.integers(min_value=-(2**62), max_value=2**62), min_size=1, max_size=20),
       st.integers(min_value=0), st.integers(min_value=0, max_value=62))
def test_combine_single_bit_flip_always_detected(values: list[int], where: int, bit: int) -> None:
    i = where % len(values)
    flipped = list(values)
    flipped[i] ^= 1 << bit
    assert sdc.combine(flipped) != sdc.combine(values)


def test_signed_round_trip() -> None:
    for v in (0, 1, 2**63 - 1, 2**63, 2**64 - 1):
        s = sdc.to_signed(v)
        assert -(2**63) <= s < 2**63
        assert s & sdc.MASK64 == v


def test_structure_fingerprint_depends_on_shapes_and_dtypes() -> None:
    a = sdc.structure_fingerprint([(10, "torch.float32"), (5, "torch.float32")])
    assert a == sdc.structure_fingerprint([(10, "torch.float32"), (5, "torch.float32")])
    assert a != sdc.structure_fingerprint([(10, "torch.float32"), (5, "torch.bfloat16")])
    assert a != sdc.structure_fingerprint([(5, "torch.float32"), (10, "torch.float32")])


def test_judge_clean() -> None:
    v = sdc.judge([0, 1, 2, 3], [7, 7, 7, 7])
    assert v.clean and v.comparable and v.culprits == ()


@pytest.mark.parametrize("bad", [0, 1, 2, 3])
def test_judge_names_the_odd_one_out_of_four(bad: int) -> None:
    fps = [5, 5, 5, 5]
    fps[bad] = 6
    v = sdc.judge([0, 1, 2, 3], fps)
    assert not v.clean and v.majority and v.culprits == (bad,)
    assert f"rank {bad}" in v.explanation


def test_judge_three_ranks_and_global_rank_numbers() -> None:
    v = sdc.judge([4, 5, 6], [1, 2, 1])
    assert v.culprits == (5,) and v.majority


def test_judge_two_ranks_has_no_majority() -> None:
    v = sdc.judge([0, 1], [1, 2])
    assert not v.clean and v.comparable and not v.majority
    assert v.culprits == (0, 1)
    assert "no strict majority" in v.explanation


def test_judge_tie_makes_everyone_a_suspect() -> None:
    v = sdc.judge([0, 1, 2, 3], [1, 1, 2, 2])
    assert not v.majority and v.culprits == (0, 1, 2, 3)


def test_judge_largest_group_without_majority() -> None:
    v = sdc.judge([0, 1, 2, 3], [1, 1, 2, 3])
    assert not v.majority and v.culprits == (2, 3)


def test_judge_all_different_or_different_structure_is_not_comparable() -> None:
    assert not sdc.judge([0, 1, 2], [1, 2, 3]).comparable
    v = sdc.judge([0, 1, 2], [1, 1, 1], structures=[9, 9, 8])
    assert not v.comparable and not v.clean


def test_judge_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        sdc.judge([0, 1], [1])


def _marker(**kw: object) -> sdc.SdcMarker:
    base: dict[str, object] = dict(attempt=0, step=20, last_clean_step=10, last_clean_time=100.0, time=110.0,
                                   ranks=(0, 1, 2), fingerprints=("00", "01", "00"), culprit_ranks=(1,),
                                   majority=True, explanation="rank 1 disagrees")
    base.update(kw)
    return sdc.SdcMarker(**base)  # type: ignore[arg-type]


def test_marker_round_trip(tmp_path: Path) -> None:
    m = _marker()
    path = sdc.marker_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(m.encode())
    assert sdc.read_marker(path) == m


@pytest.mark.parametrize("text", ["", "{}", "[1]", '{"format": "trainguard-sdc"}', "not json",
                                  json.dumps({**_marker().to_json(), "step": -1}),
                                  json.dumps({**_marker().to_json(), "culprit_ranks": ["x"]}),
                                  json.dumps({**_marker().to_json(), "time": "soon"}),
                                  json.dumps({**_marker().to_json(), "majority": 1})])
def test_bad_markers_are_ignored(tmp_path: Path, text: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(text)
    assert sdc.read_marker(path) is None
    assert sdc.read_marker(tmp_path / "absent.json") is None


def test_rollback_plan() -> None:
    plan = sdc.rollback_plan([5, 10, 15, 20], 10)
    assert plan.resume_step == 10 and plan.set_aside == (20, 15)
    assert sdc.rollback_plan([15, 20], 10) == sdc.RollbackPlan(None, (20, 15))
    assert sdc.rollback_plan([], 10) == sdc.RollbackPlan(None, ())
    assert sdc.rollback_plan([5], 0) == sdc.RollbackPlan(None, (5,))


def test_exclusion_decision() -> None:
    m = _marker(culprit_ranks=(2,))
    nodes = {0: "a", 1: "a", 2: "b", 3: "b"}
    assert sdc.exclusion_decision(m, nodes, "b", max_nodes=2).exclude
    assert sdc.exclusion_decision(m, nodes, "a", max_nodes=2) == sdc.ExclusionDecision(False, "")
    only = sdc.exclusion_decision(m, {2: "b"}, "b", max_nodes=1)
    assert not only.exclude and "only node" in only.reason
    unsure = sdc.exclusion_decision(_marker(culprit_ranks=(0, 2), majority=False), nodes, "b", max_nodes=2)
    assert not unsure.exclude and "no majority" in unsure.reason


def test_check_every_validation() -> None:
    assert sdc.check_every("0") == 0 and sdc.check_every(25) == 25
    for bad in ("-1", "x", "1.5", "", str(10**12)):
        with pytest.raises(UsageError, match="--sdc-check-every"):
            sdc.check_every(bad)
    assert sdc.env_check_every({"TRAINGUARD_SDC_EVERY": "junk"}) == 0
    assert sdc.env_check_every({"TRAINGUARD_SDC_EVERY": "7"}) == 7
    assert sdc.env_check_every({}) == 0


def test_chaos_grammar_for_sdc() -> None:
    (f,) = chaos.parse_spec("sdc@step=12,rank=2")
    assert f.kind == "sdc" and f.step == 12 and f.rank == 2
    assert chaos.format_spec([f]) == "sdc@step=12,rank=2"
    with pytest.raises(UsageError, match="sdc needs step"):
        chaos.parse_spec("sdc@rank=1")
    with pytest.raises(UsageError, match="takes no key"):
        chaos.parse_spec("sdc@step=1,factor=2")
    assert chaos.check_schedule([f], 2)  # rank 2 of a 2-rank job does not exist
    assert not chaos.schedule_warnings([f], auto_instrument=True)


class _Target:
    def __init__(self, ready: bool) -> None:
        self.is_ready = ready
        self.flips = 0

    def ready(self) -> bool:
        return self.is_ready

    def corrupt(self) -> str:
        self.flips += 1
        return "flipped"


def test_injector_waits_for_parameters_then_fires_once(tmp_path: Path) -> None:
    faults = chaos.parse_spec("sdc@step=3,rank=1")
    fired: list[int] = []
    inj = chaos.Injector(faults, rank=1, attempt=0, marker_dir=tmp_path, record=lambda f, s: fired.append(s))
    inj.on_step_start(3)  # no target at all: not fired, no marker
    target = _Target(ready=False)
    inj.sdc_target = target
    inj.on_step_start(4)  # nothing to corrupt yet
    assert target.flips == 0 and not (tmp_path / "fired-0").exists()
    target.is_ready = True
    inj.on_step_start(5)
    inj.on_step_start(6)
    assert target.flips == 1 and fired == [5] and (tmp_path / "fired-0").exists()
    other = chaos.Injector(faults, rank=1, attempt=1, marker_dir=tmp_path)
    other.sdc_target = _Target(ready=True)
    other.on_step_start(7)  # a restart does not fire it again
    assert other.sdc_target.flips == 0  # type: ignore[attr-defined]
