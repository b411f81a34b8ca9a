"""A rank slowed by chaos ``slow`` is named by `trainguard stragglers` with a cost close to the measured loss; clean
runs flag nobody. Real multi-process gloo runs: an unmodified DDP script (flight-recorder probes) and the demo
(phases of trainguard.attach())."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._run_helpers import ROOT, TINY_DEMO, events, of_type, trainguard
from trainguard.chaos.faults import paused_path
from trainguard.core.protocol import RunLayout

PLAIN_DDP = ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py"
STEPS = 90


def _plain(run_dir: Path, inject: str) -> None:
    res = trainguard("run", "--standalone", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--quiet",
                     "--no-health-checks", "--inject", inject, str(PLAIN_DDP), "--steps", str(STEPS),
                     "--ckpt-dir", str(run_dir / "ck"), "--ckpt-every", "1000", "--step-seconds", "0.05",
                     timeout=240, env={"TRAINGUARD_STRAGGLER_PROBE_SECONDS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]


def _stragglers(run_dir: Path) -> dict[str, Any]:
    res = trainguard("stragglers", str(run_dir), "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


@pytest.mark.slow
def test_unmodified_script_slow_rank_is_named_with_a_cost_close_to_the_measured_loss(tmp_path: Path) -> None:
    _plain(tmp_path / "slow", "slow@step=5,rank=1,factor=1.3")
    _plain(tmp_path / "clean", "none")
    slow, clean = _stragglers(tmp_path / "slow"), _stragglers(tmp_path / "clean")
    assert clean["stragglers"] == [], clean
    assert [s["rank"] for s in slow["stragglers"]] == [1], slow
    first = slow["stragglers"][0]
    assert first["signal"] == "flight-recorder"  # the script has no phases: the probes' dumps told
    # The pause starts at step 6 (slow's first step measures the pace); named within 45 steps of it (the
    # span is five windows of eight steps: docs/stragglers.md).
    assert first["detected_step"] <= 6 + 45
    assert first["slowdown"] == pytest.approx(1.3, abs=0.1)
    # The loss is what the fault paused rank 1 (the others wait for it at every step), counted in the same run:
    # two runs' durations differ by more than that at load (a CI run at load 6-7 failed that comparison).
    injected = float(paused_path(RunLayout(tmp_path / "slow").chaos_dir, 1).read_text())
    assert injected > 0.3
    assert first["cost_seconds"] == pytest.approx(injected, rel=0.25), (first, injected)
    assert slow["step_time_without"]["1"] < slow["step_time_seconds"]
    # The supervisor named it live and recorded the policy it applied.
    live = of_type(events(tmp_path / "slow", "agent-"), "straggler_detected")
    assert [(r["rank"], r["action"]) for r in live] == [(1, "report")]
    assert not of_type(events(tmp_path / "clean", "agent-"), "straggler_detected")
    # The goodput report carves the straggler's cost out of productive time.
    report = json.loads(trainguard("report", str(tmp_path / "slow"), "--json").stdout)
    assert report["badput_seconds"]["straggler"] == pytest.approx(first["cost_seconds"], rel=0.05)
    clean_report = json.loads(trainguard("report", str(tmp_path / "clean"), "--json").stdout)
    assert clean_report["badput_seconds"]["straggler"] == 0


DEMO_STEPS = 300
"""A 1.3x rank's pause (~4 ms of a ~13 ms step) must outlast a loaded host's noise: at load 6-9 the rule took 25-102
steps to name it (its noise bar shrinks as 1/sqrt(steps)), and a CI run at load of 120 steps named nobody. The
steps are cheap: the demo's time is its start-up."""


def _demo(run_dir: Path, inject: str) -> dict[str, Any]:
    res = trainguard("demo", "--ranks", "3", "--steps", str(DEMO_STEPS), "--ckpt-every", "60", "--model", TINY_DEMO,
                     "--run-dir", str(run_dir), "--inject", inject, "--json", timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


@pytest.mark.slow
def test_demo_slow_rank_2_is_named_first_and_a_clean_demo_flags_nobody(tmp_path: Path) -> None:
    assert _demo(tmp_path / "slow", "slow@step=1,rank=2,factor=1.3")["completed_steps"] == DEMO_STEPS
    slow = _stragglers(tmp_path / "slow")
    assert slow["stragglers"] and slow["stragglers"][0]["rank"] == 2, slow
    assert slow["stragglers"][0]["signal"] == "phases"
    assert slow["stragglers"][0]["host"]
    _demo(tmp_path / "clean", "none")
    # A clean demo has no rank slow through its run. It may have a short burst: the suite runs another test beside
    # this one on 2 cores, and a CI run's clean demo had rank 1 held back for real (1.46x, steps 4-56 of 300, 0.33 s)
    # by that neighbour, then on par for the remaining 244 steps. Such a burst is a true finding of that run, not a
    # rule's bias; a bias (a rank's own bookkeeping read as lateness, as once on 3 ms steps) lasts the whole run.
    # Nobody at any length is asserted on recorded clean runs (tests/unit/test_stragglers.py).
    clean = _stragglers(tmp_path / "clean")
    assert all(s["steps"] < DEMO_STEPS // 2 for s in clean["stragglers"]), clean["stragglers"]


@pytest.fixture(scope="module")
def slow_from_the_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 4-rank demo whose rank 2 is 1.3x slow from its first step (shared by the assertions below). 90 steps:
    fewer than the live watch keeps (`trainguard.stragglers.watch.BUFFER_STEPS`, 96), so it judges the whole run
    from the start too."""
    run_dir = tmp_path_factory.mktemp("slow-from-start")
    res = trainguard("demo", "--ranks", "4", "--steps", "90", "--model", TINY_DEMO, "--run-dir", str(run_dir),
                     "--inject", "slow@step=1,rank=2,factor=1.3", "--json", timeout=240,
                     env={"TRAINGUARD_STRAGGLER_PROBE_SECONDS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_demo_rank_slow_from_the_first_step_is_named_afterwards(slow_from_the_start: Path) -> None:
    # Every rank's step time is the same (the others wait in the all-reduce) and the rank has no fast history: it
    # is named against its peers over the whole run. Naming and rank only: the figures depend on the host's load.
    doc = _stragglers(slow_from_the_start)
    assert [s["rank"] for s in doc["stragglers"]] == [2], doc["stragglers"]
    s = doc["stragglers"][0]
    # Slow from step 1: the onset falls in the first window of 8 steps (where in it depends on the host's noise;
    # a fresh-clone CI run at load put it at step 5).
    assert s["signal"] == "phases" and s["onset_step"] <= 8 and s["slowdown"] > 1


@pytest.mark.slow
def test_demo_rank_slow_from_the_first_step_is_named_live(slow_from_the_start: Path) -> None:
    # Named while the job runs, by the agent's watch. How soon (the goal: within 30 steps of onset) depends on the
    # host's load and is benchmarks/stragglers.py's figure (online_within_30_steps_rate), not asserted here: at
    # load 4-5 with the suite's two workers it came at step 33, at load 6-9 as late as step 102.
    live = of_type(events(slow_from_the_start, "agent-"), "straggler_detected")
    assert [r["rank"] for r in live] == [2], live
