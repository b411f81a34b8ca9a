"""The simulator against closed forms it does not compute itself: renewal-reward ETTR and Poisson counts.

With failures a Poisson process of rate lam, the time from one failure to the next is Exp(lam). A segment
recovers for u = detection + restart, then trains in cycles of tau + w (synchronous saves), and keeps
k tau when k saves completed. By the renewal-reward theorem the long-run ETTR is
E[kept] / E[segment] = lam tau E[exp(-lam u)] q / (1 - q), with q = exp(-lam (tau + w)), exact to all
orders (unlike Meta's first-order approximation). Recovery schemes change only E[exp(-lam u)]:
in-process restarts make u a mixture, warm spares and in-memory restores shorten it. Replica groups
have their own closed form (below). Tolerance: 4 Monte Carlo standard errors plus the horizon's edge
effects (the first start has no detection, the last segment keeps whole steps): (u + tau + w) / T.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainguard.accounting.goodput import BUCKETS
from trainguard.sim.engine import simulate
from trainguard.sim.models import FailureModel, parse_model
from trainguard.sim.policy import JobConfig, PolicyConfig

Z = 4.0
NODES = 1024
DAYS = 30.0


def _model(rate_per_node_day: float, **extra: object) -> FailureModel:
    return parse_model({"name": "t", "gpus_per_node": 8, "failure": [
        {"category": "Faulty GPU", "rate_per_node_day": rate_per_node_day, "detection": "crash", **extra}]})


def _renewal_ettr(lam: float, tau: float, w: float, laplace_u: float) -> float:
    q = math.exp(-lam * (tau + w))
    return lam * tau * laplace_u * q / (1 - q)


def _run(model: FailureModel, policy: PolicyConfig, trials: int = 200, seed: int = 3) -> tuple[float, float, float]:
    r = simulate(model, JobConfig(gpus=NODES * 8, days=DAYS, step_seconds=1.0), policy, trials=trials, seed=seed)
    return float(r.ettr.mean()), float(r.ettr.std(ddof=1) / math.sqrt(trials)), r.interval_seconds


def _check(sim: float, stderr: float, exact: float, edge_seconds: float) -> None:
    assert abs(sim - exact) <= Z * stderr + edge_seconds / (DAYS * 86400), (sim, exact)


@pytest.mark.parametrize(("hours_between", "tau_min", "w", "overhead"),
                         [(3.0, 20, 60, 600), (0.4, 6, 30, 600), (1.0, 10, 5, 120)])
def test_full_restart_matches_the_renewal_reward_ettr(hours_between: float, tau_min: float, w: float,
                                                      overhead: float) -> None:
    lam = 1 / (hours_between * 3600)
    model = _model(86400 * lam / NODES, repair="restart")
    policy = PolicyConfig(interval=str(tau_min), checkpoint_stall_seconds=w, restart_overhead_seconds=overhead,
                          relaunch_seconds=20.0, restore_seconds=30.0, crash_detection_seconds=30.0)
    sim, err, tau = _run(model, policy)
    u = 30.0 + overhead
    _check(sim, err, _renewal_ettr(lam, tau, w, math.exp(-lam * u)), u + tau + w)


def test_inprocess_share_makes_the_restart_a_mixture() -> None:
    lam = 1 / 1800
    model = _model(86400 * lam / NODES, repair="restart")
    p, fast = 0.7, 20.0
    policy = PolicyConfig(interval="8", checkpoint_stall_seconds=10, crash_detection_seconds=5.0,
                          inprocess_share=p, inprocess_restart_seconds=fast)
    sim, err, tau = _run(model, policy)
    laplace = p * math.exp(-lam * (5 + fast)) + (1 - p) * math.exp(-lam * (5 + 600))
    _check(sim, err, _renewal_ettr(lam, tau, 10, laplace), 605 + tau + 10)
    # and it really is better than restarting everything
    plain, _, _ = _run(model, policy.with_(inprocess_share=0.0))
    assert sim > plain + 0.05


@pytest.mark.parametrize(("memory", "repair", "restore"), [("local", "restart", 3.0), ("local", "replace", 120.0),
                                                            ("peer", "replace", 3.0), ("off", "restart", 120.0)])
def test_warm_spares_and_in_memory_restore_shorten_the_restart(memory: str, repair: str, restore: float) -> None:
    lam = 1 / 3600
    model = _model(86400 * lam / NODES, repair=repair)
    policy = PolicyConfig(interval="10", checkpoint_stall_seconds=5, crash_detection_seconds=10.0,
                          warm_start_seconds=15.0, memory_checkpoint=memory, memory_restore_seconds=3.0)
    sim, err, tau = _run(model, policy)
    # warm: relaunch + startup = 15 s; restore from memory only when the copy survived
    u = 10.0 + 15.0 + restore
    _check(sim, err, _renewal_ettr(lam, tau, 5, math.exp(-lam * u)), u + tau + 5)


def test_replica_groups_lose_only_the_failed_groups_share() -> None:
    """Only group-local failures: nothing rolls back. The survivors pause for detection + quorum, cut
    short by the next failure: E[min(p, Exp(lam))] = (1 - exp(-lam p)) / lam; the failed group's
    restart R costs R / G. So ETTR = exp(-lam p) - lam R / G, exactly, in expectation."""
    lam = 1 / 1800
    groups, det, quorum, overhead = 8, 30.0, 5.0, 600.0
    model = _model(86400 * lam / NODES, repair="replace")
    policy = PolicyConfig(crash_detection_seconds=det, restart_overhead_seconds=overhead, replica_groups=groups,
                          group_reconfigure_seconds=quorum)
    sim, err, _ = _run(model, policy)
    exact = math.exp(-lam * (det + quorum)) - lam * overhead / groups
    _check(sim, err, exact, policy.startup_seconds + overhead)
    job_wide, _, _ = _run(model, policy.with_(replica_groups=1))
    assert job_wide < sim - 0.2


def test_replica_groups_still_roll_back_on_network_failures() -> None:
    """A network-scope failure stops every group: it is a full restart, as without replica groups."""
    lam = 1 / 3600
    model = _model(86400 * lam / NODES, scope="network", repair="restart")
    policy = PolicyConfig(interval="20", crash_detection_seconds=30.0, checkpoint_stall_seconds=30)
    grouped = simulate(model, JobConfig(gpus=NODES * 8, days=5), policy.with_(replica_groups=16), trials=30, seed=1)
    plain = simulate(model, JobConfig(gpus=NODES * 8, days=5), policy, trials=30, seed=1)
    np.testing.assert_allclose(grouped.ettr, plain.ettr, rtol=1e-12)


def test_replica_group_buckets_still_sum_to_the_wall_time() -> None:
    model = parse_model({"failure": [
        {"category": "Faulty GPU", "rate_per_node_day": 0.01, "scope": "gpu"},
        {"category": "Network Switch/Cable", "rate_per_node_day": 0.003, "scope": "network", "detection": "hang"},
        {"category": "Silent Data Corruption", "rate_per_node_day": 0.001, "detection": "sdc"}]})
    job = JobConfig(gpus=16384, days=5)
    policy = PolicyConfig(replica_groups=4, inprocess_share=0.5, memory_checkpoint="peer",
                          checkpoint_total_seconds=200, straggler_per_day=2)
    r = simulate(model, job, policy, trials=40, seed=2)
    total = r.ettr * job.days * 86400 + sum(r.buckets[b] for b in BUCKETS)
    np.testing.assert_allclose(total, job.days * 86400, rtol=1e-12)
    assert all((r.buckets[b] >= -1e-9).all() for b in BUCKETS)
    assert r.buckets["straggler"].mean() > 0


def test_category_counts_follow_their_rates() -> None:
    """A superposed Poisson process picks category c with probability r_c / r: E N_c = N r_c T."""
    model = parse_model({"failure": [
        {"category": "Faulty GPU", "rate_per_node_day": 0.003},
        {"category": "NIC", "rate_per_node_day": 0.001, "detection": "hang"}]})
    trials = 400
    r = simulate(model, JobConfig(gpus=8 * 2000, days=10), PolicyConfig(), trials=trials, seed=8)
    for col, rate in ((0, 0.003), (1, 0.001)):
        expected = 2000 * rate * 10
        assert abs(r.counts[:, col].mean() - expected) < Z * math.sqrt(expected / trials)
