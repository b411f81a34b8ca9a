"""Checking a fault schedule before launch: ranks that do not exist, kinds the automatic hooks cannot fire."""

from __future__ import annotations

from trainguard.chaos import faults as chaos


def test_a_good_schedule_has_no_problems() -> None:
    faults = chaos.parse_spec("crash@step=3,rank=1;hang@step=5,rank=3;slow@step=1,factor=2;desync@step=4;"
                              "exit@step=2,code=3;unhealthy@node=n1")
    assert chaos.check_schedule(faults, world_size_max=4) == []
    assert chaos.schedule_warnings(faults, auto_instrument=True) == []


def test_a_rank_beyond_the_world_is_named() -> None:
    problems = chaos.check_schedule(chaos.parse_spec("crash@step=3,rank=4"), world_size_max=4)
    assert len(problems) == 1 and "rank 4 does not exist" in problems[0] and "at most 4 ranks" in problems[0]


def test_faults_that_need_attach_are_warned_about_not_refused() -> None:
    # The script is not inspected: it may call trainguard.attach(), so these launch (with a warning) and
    # are reported at the end if they never fired.
    faults = chaos.parse_spec("hang-in-collective@step=2,rank=1")
    assert chaos.check_schedule(faults, world_size_max=2) == []
    warnings = chaos.schedule_warnings(faults, auto_instrument=True)
    assert len(warnings) == 1 and "trainguard.attach()" in warnings[0]
    off = chaos.schedule_warnings(chaos.parse_spec("crash@step=2"), auto_instrument=False)
    assert len(off) == 1 and "automatic instrumentation is off" in off[0]


def test_hang_in_collective_without_its_group_does_not_fire(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fired: list[int] = []
    injector = chaos.Injector(chaos.parse_spec("hang-in-collective@step=1"), rank=0, attempt=0, marker_dir=tmp_path,
                              record=lambda f, s: fired.append(s))
    injector.on_step_start(1)  # would block forever if it fired
    assert fired == [] and not (tmp_path / "fired-0").exists()
