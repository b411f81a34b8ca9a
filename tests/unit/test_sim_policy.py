"""Simulator configs validate themselves with domain errors naming the field; ``auto`` means Daly."""

from __future__ import annotations

import pytest

from trainguard.checkpoint.interval import IntervalPolicy
from trainguard.core.interval_theory import AUTO_FORMULA, daly_seconds
from trainguard.errors import TrainguardError
from trainguard.sim.errors import SimConfigError
from trainguard.sim.policy import JobConfig, PolicyConfig, checkpoint_interval_seconds, validate, validate_seed


@pytest.mark.parametrize(("make", "field"), [
    (lambda: JobConfig(gpus=0), "gpus"),
    (lambda: JobConfig(days=float("nan")), "days"),
    (lambda: JobConfig(step_seconds=5e-324), "step_seconds"),
    (lambda: PolicyConfig(checkpoint_stall_seconds=-1), "checkpoint_stall_seconds"),
    (lambda: PolicyConfig(restart_overhead_seconds=10), "restart_overhead_seconds"),
    (lambda: PolicyConfig(checkpoint_total_seconds=1), "checkpoint_total_seconds"),
    (lambda: PolicyConfig(inprocess_share=1.5), "inprocess_share"),
    (lambda: PolicyConfig(warm_start_seconds=float("inf")), "warm_start_seconds"),
    (lambda: PolicyConfig(memory_checkpoint="disk"), "memory_checkpoint"),
    (lambda: PolicyConfig(replica_groups=0), "replica_groups"),
    (lambda: PolicyConfig(interval="often"), "interval"),
    (lambda: validate(JobConfig(), PolicyConfig(), 0), "trials"),
    (lambda: validate_seed(-1), "seed"),
])
def test_bad_values_raise_a_domain_error_naming_the_field(make: object, field: str) -> None:
    with pytest.raises(SimConfigError) as exc:
        make()  # type: ignore[operator]
    assert exc.value.field == field
    assert isinstance(exc.value, ValueError) and not isinstance(exc.value, TrainguardError)
    assert str(exc.value).startswith(field) and "--" not in str(exc.value)  # no option names: the CLI adds them


def test_auto_means_daly_in_the_simulator_and_the_checkpointer() -> None:
    assert AUTO_FORMULA == "daly"
    mtbf, cost = 3.09 * 3600, 60.0
    sim = checkpoint_interval_seconds(PolicyConfig(interval="auto", checkpoint_stall_seconds=cost), mtbf, 0.001)
    assert sim == pytest.approx(daly_seconds(cost, mtbf), abs=0.001)
    ckpt = IntervalPolicy.auto(mtbf, save_cost_seconds=cost)
    assert ckpt.seconds == pytest.approx(sim, abs=0.001)
