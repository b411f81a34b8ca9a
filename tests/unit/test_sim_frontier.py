"""The frontier of (checkpoint stall, restart time, recovery scheme) for a target ETTR.

Every point is re-simulated with `simulate` (not the frontier's cached evaluator) and must reach the
target; a slightly longer restart at the same stall must not (the point is the loosest requirement);
no point may be dominated by another of its scheme; an unreachable target gives no points.
"""

from __future__ import annotations

import itertools

import pytest

from trainguard.sim.engine import simulate
from trainguard.sim.errors import SimConfigError
from trainguard.sim.frontier import (
    MAX_RESTART_SECONDS,
    Frontier,
    FrontierConfig,
    FrontierPoint,
    find_frontier,
    frontier_json,
    pareto,
    scheme_policy,
)
from trainguard.sim.models import load_model
from trainguard.sim.policy import JobConfig, PolicyConfig

TRIALS, SEED = 20, 4
JOB = JobConfig(gpus=32768, days=4)
BASE = PolicyConfig(hang_timeout_seconds=60.0, sdc_check_seconds=600.0)
CONFIG = FrontierConfig(target_ettr=0.9, stalls_seconds=(1.0, 10.0, 60.0, 300.0), replica_groups=8)


@pytest.fixture(scope="module")
def frontier() -> Frontier:
    return find_frontier(load_model("llama3"), JOB, BASE, CONFIG, trials=TRIALS, seed=SEED)


def _ettr(policy: PolicyConfig) -> float:
    return float(simulate(load_model("llama3"), JOB, policy, trials=TRIALS, seed=SEED).ettr.mean())


def test_every_point_reaches_the_target_and_a_longer_restart_does_not(frontier: Frontier) -> None:
    assert frontier.reachable
    assert {p.scheme for p in frontier.points} == {"restart", "inprocess", "replica-groups"}
    for p in frontier.points:
        policy = scheme_policy(BASE, p.scheme, p.restart_seconds, p.checkpoint_stall_seconds, CONFIG)
        assert _ettr(policy) >= CONFIG.target_ettr, p
        if p.restart_seconds < MAX_RESTART_SECONDS:
            looser = scheme_policy(BASE, p.scheme, p.restart_seconds * 1.05, p.checkpoint_stall_seconds, CONFIG)
            assert _ettr(looser) < CONFIG.target_ettr, p


def test_no_point_is_dominated_and_longer_stalls_need_faster_restarts(frontier: Frontier) -> None:
    for scheme in CONFIG.schemes:
        pts = sorted((p for p in frontier.points if p.scheme == scheme), key=lambda p: p.checkpoint_stall_seconds)
        assert pts, scheme
        for a, b in itertools.pairwise(pts):
            assert a.checkpoint_stall_seconds < b.checkpoint_stall_seconds
            assert a.restart_seconds > b.restart_seconds
    # replica groups tolerate far slower restarts than a whole-job restart at the same stall
    by = {(p.scheme, p.checkpoint_stall_seconds): p.restart_seconds for p in frontier.points}
    assert by[("replica-groups", 1.0)] > 2 * by[("restart", 1.0)]


def test_pareto_drops_dominated_points() -> None:
    def pt(stall: float, restart: float) -> FrontierPoint:
        return FrontierPoint("restart", stall, restart, 0.9, 1.0)

    kept = pareto([pt(1, 100), pt(2, 80), pt(2, 50), pt(5, 80), pt(10, 10), pt(10, 10)])
    assert [(p.checkpoint_stall_seconds, p.restart_seconds) for p in kept] == [(1, 100), (5, 80), (10, 10), (10, 10)]


def test_an_unreachable_target_says_so() -> None:
    config = FrontierConfig(target_ettr=0.999, stalls_seconds=(1.0, 60.0))
    out = find_frontier(load_model("llama3"), JOB, PolicyConfig(), config, trials=5, seed=1)
    assert not out.reachable and out.points == ()
    doc = frontier_json(out)
    assert doc["reachable"] is False and doc["points"] == []
    assert all(v < 0.999 for v in doc["best_ettr"].values())
    # what stands in the way is reported: detection, with the default 10-minute hang timeout
    assert max(doc["corner_badput_fraction"]["restart"], key=doc["corner_badput_fraction"]["restart"].get) == \
        "detection"


def test_an_unreachable_scheme_says_how_much_faster_detection_must_be() -> None:
    """The detection factor is checked with `simulate` on a policy whose detection settings are scaled
    (not the evaluator's scaled draws): at f the corner reaches the target, at f + 0.02 it does not."""
    model, job = load_model("llama3"), JobConfig(gpus=131072, days=4)
    base = PolicyConfig()  # a 10-minute hang timeout keeps 131,072 GPUs below 0.9 (docs/simulation.md)
    config = FrontierConfig(target_ettr=0.9, stalls_seconds=(1.0,), schemes=("restart",))
    out = find_frontier(model, job, base, config, trials=TRIALS, seed=SEED)
    f = out.detection_scale["restart"]
    assert not out.reachable and f is not None and 0.05 < f < 1

    def corner(scale: float) -> float:
        scaled = base.with_(crash_detection_seconds=base.crash_detection_seconds * scale,
                            hang_timeout_seconds=base.hang_timeout_seconds * scale,
                            sdc_check_seconds=base.sdc_check_seconds * scale)
        policy = scheme_policy(scaled, "restart", 0.5, 1.0, config)
        return float(simulate(model, job, policy, trials=TRIALS, seed=SEED).ettr.mean())

    assert corner(f) >= 0.9 > corner(f + 0.02)
    assert frontier_json(out)["detection_scale"] == {"restart": f}


@pytest.mark.parametrize(("field", "kwargs"), [("target_ettr", {"target_ettr": 1.0}),
                                               ("inprocess_share", {"inprocess_share": 0.0}),
                                               ("replica_groups", {"replica_groups": 1}),
                                               ("schemes", {"schemes": ("teleport",)})])
def test_config_names_the_bad_field(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(SimConfigError) as exc:
        FrontierConfig(**kwargs)  # type: ignore[arg-type]
    assert exc.value.field == field
