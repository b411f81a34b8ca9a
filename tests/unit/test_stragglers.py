"""Straggler analysis on synthetic synchronous jobs: who is slow, from when, what it costs; clean runs flag nobody."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.core.events import Event, StepCompleted
from trainguard.stragglers import FLIGHT_RECORDER, PHASES, StragglerConfig, analyze
from trainguard.stragglers.analysis import DURATIONS, _lead, _leads


def synth(ranks: int = 4, steps: int = 60, slow: dict[int, float] | None = None, onset: int = 10,
          own: float = 0.1, comm: float = 0.01, noise: float = 0.02, seed: int = 0, hosts: int = 1,
          phases: bool = True, spikes: float = 0.0, jitter: float = 0.0, until: int | None = None,
          ) -> tuple[list[Event], dict[int, dict[int, list[float]]], float]:
    """A synchronous job: each rank works ``own`` (x noise) then all-reduces; a slow rank works ``factor`` x the
    clean step time longer from step ``onset`` on (as chaos ``slow`` does; ``onset=1``: from the first step) to step
    ``until`` (default: the end).
    ``jitter``: each rank also waits an exponential delay of mean ``jitter x own`` per step (a busy host's scheduler:
    heavy-tailed, often larger than the slowness sought). Returns (records, arrivals, seconds the slowness added)."""
    rng = random.Random(seed)
    slow = slow or {}
    t = 1000.0
    recs: list[Event] = []
    arrivals: dict[int, list[float]] = {r: [] for r in range(ranks)}
    added = 0.0
    per_host = max(1, ranks // hosts)
    for s in range(1, steps + 1):
        works = {}
        for r in range(ranks):
            w = own * (1 + rng.gauss(0, noise))
            if spikes and rng.random() < spikes:
                w *= 1.5  # a one-off hiccup (GC pause, page fault storm)
            if jitter:
                w += rng.expovariate(1.0 / (jitter * own))
            works[r] = w
        clean = max(works.values()) + comm
        for r, f in slow.items():
            if onset <= s <= (until or steps):
                works[r] += (f - 1) * (own + comm)
        step = max(works.values()) + comm
        added += step - clean
        for r in range(ranks):
            arrivals[r].append(t + works[r])
            ph = {"forward_backward": works[r], "comm_wait": step - works[r]} if phases else {}
            recs.append(StepCompleted(time=t + step, host=f"h{r // per_host}", attempt=0, rank=r, step=s,
                                      duration_seconds=step, phases=ph))
        t += step
    return recs, {0: arrivals}, added


def test_slow_rank_named_within_45_steps_with_cost_within_25_percent() -> None:
    recs, _, added = synth(slow={2: 1.3}, onset=10)
    rep = analyze(recs)
    assert [s.rank for s in rep.stragglers] == [2]
    s = rep.stragglers[0]
    assert s.signal == PHASES and s.host == "h0"
    assert s.detected_step - 10 <= 45  # five windows of eight steps (StragglerConfig.windows)
    assert abs(s.onset_step - 10) <= 2
    assert s.cost_seconds == pytest.approx(added, rel=0.25)
    assert s.slowdown == pytest.approx(1.3, abs=0.06)
    doc = rep.to_json()
    assert doc["stragglers"][0]["rank"] == 2 and set(doc["stragglers"][0]) >= {"rank", "host", "slowdown",
                                                                               "cost_seconds"}
    assert doc["step_time_without"]["2"] == pytest.approx(0.11, rel=0.05)


@pytest.mark.parametrize("seed", range(12))
def test_clean_runs_with_ordinary_noise_flag_nothing(seed: int) -> None:
    recs, arrivals, _ = synth(ranks=2 + seed % 7, steps=120, noise=0.03 + 0.01 * (seed % 3), seed=seed, spikes=0.05)
    assert analyze(recs).stragglers == []
    no_phases = [replace(e, phases={}) for e in recs if isinstance(e, StepCompleted)]
    assert analyze(no_phases, arrivals).stragglers == []


@pytest.mark.parametrize("onset", [1, 20])
def test_a_sub_millisecond_lead_on_tiny_steps_is_no_straggler(onset: int) -> None:
    # A clean 2-rank CPU demo at load 8.5: 3 ms steps, rank 0 doing ~0.35 ms more of its own work each step
    # (1.13x). Before the floor (StragglerConfig.min_lead_seconds) the onset rule named it.
    recs, _, _ = synth(ranks=2, steps=160, own=0.0025, comm=0.0005, noise=0.01, slow={0: 1.13}, onset=onset)
    assert analyze(recs).stragglers == []
    # The same rank 1.3x slow on the same steps (~0.9 ms a step) is still named.
    recs, _, _ = synth(ranks=2, steps=160, own=0.0025, comm=0.0005, noise=0.01, slow={0: 1.3}, onset=onset)
    assert [s.rank for s in analyze(recs).stragglers] == [0]


def test_one_noisy_step_never_flags() -> None:
    recs, _, _ = synth(noise=0.0)
    bumped = [replace(e, phases={"forward_backward": 1.0, "comm_wait": 0.0}, duration_seconds=1.0)
              if isinstance(e, StepCompleted) and e.rank == 1 and e.step in (30, 31) else e for e in recs]
    assert analyze(bumped).stragglers == []


def test_two_ranks_flight_recorder_names_the_late_arriver() -> None:
    recs, arrivals, added = synth(ranks=2, slow={1: 1.3}, onset=5, phases=False)
    rep = analyze(recs, arrivals)
    assert rep.signals == {0: FLIGHT_RECORDER}
    assert [s.rank for s in rep.stragglers] == [1]
    assert rep.stragglers[0].cost_seconds == pytest.approx(added, rel=0.25)
    assert rep.stragglers[0].detected_step <= 5 + 45


def test_durations_only_cannot_name_anyone_and_says_so() -> None:
    recs, _, _ = synth(slow={2: 1.5}, phases=False)
    rep = analyze(recs)
    assert rep.stragglers == [] and rep.signals == {0: DURATIONS}
    assert "cannot be named" in rep.notes[0]


def test_whole_host_slow_is_a_host_problem() -> None:
    recs, _, _ = synth(ranks=8, hosts=4, slow={2: 1.3, 3: 1.3})
    rep = analyze(recs)
    assert sorted(s.rank for s in rep.stragglers) == [2, 3]
    assert rep.hosts[0].host == "h1" and rep.hosts[0].whole_host
    assert not any(h.whole_host for h in rep.hosts[1:])


def test_two_stragglers_ranked_by_cost() -> None:
    recs, _, _ = synth(ranks=6, slow={1: 1.2, 4: 1.5})
    rep = analyze(recs)
    # Only the slowest rank gates a step; the milder one costs nothing while the worse one is there.
    assert rep.stragglers[0].rank == 4


def test_config_is_checked() -> None:
    with pytest.raises(ValueError):
        StragglerConfig(window_steps=1)
    with pytest.raises(ValueError):
        StragglerConfig(min_slowdown=0.5)


def test_delay_before_the_step_clock_is_seen_through_comm_wait() -> None:
    # With attach(), a pause before ``tg.step`` is outside the rank's own step time: only the others' longer
    # wait (and its shorter one) shows it.
    recs, _, added = synth(slow={1: 1.3}, onset=10)
    moved = []
    for e in recs:
        if isinstance(e, StepCompleted) and e.rank == 1 and e.step >= 10:
            pause = e.phases["forward_backward"] - next(x for x in recs if isinstance(x, StepCompleted)
                                                    and x.step == e.step and x.rank == 0).phases["forward_backward"]
            work = e.phases["forward_backward"] - max(pause, 0.0)
            e = replace(e, duration_seconds=e.duration_seconds - max(pause, 0.0),
                        phases={"forward_backward": work, "comm_wait": e.phases["comm_wait"]})
        moved.append(e)
    rep = analyze(moved)
    assert [s.rank for s in rep.stragglers] == [1]
    assert rep.stragglers[0].cost_seconds == pytest.approx(added, rel=0.25)


def test_steps_after_the_last_probe_are_costed_at_the_measured_pace() -> None:
    recs, arrivals, added = synth(ranks=2, slow={0: 1.3}, onset=5, phases=False, steps=90)
    cut = {0: {r: ts[:60] for r, ts in arrivals[0].items()}}  # the last probe saw 60 steps
    rep = analyze(recs, cut)
    (s,) = rep.stragglers
    assert s.last_step == 90
    assert s.cost_seconds == pytest.approx(added, rel=0.25)


@given(st.dictionaries(st.integers(0, 50), st.sampled_from([0.0, 0.5, 1.0]) | st.floats(-1e3, 1e3), min_size=2,
                       max_size=12))
def test_fast_leads_equal_the_definition(own: dict[int, float]) -> None:
    fast = _leads(own)
    for r in own:
        assert fast[r] == pytest.approx(_lead(own, r), abs=1e-9)


def test_a_rank_hardly_behind_the_next_slowest_is_not_named() -> None:
    # Ranks 1 and 2 both slow (1.20x, 1.17x): rank 1 is late against the others' median every step, but the job
    # without it would be only ~3% faster (rank 2 then holds it back), below min_slowdown.
    recs, _, _ = synth(ranks=3, slow={1: 1.20, 2: 1.17}, onset=1, noise=0.005)
    assert analyze(recs).stragglers == []
    # One clearly slow rank among them still is.
    recs, _, _ = synth(ranks=3, slow={1: 1.30}, onset=1, noise=0.005)
    assert [s.rank for s in analyze(recs).stragglers] == [1]


def _recorded(name: str) -> list[Event]:
    """A recorded run's step records (tests/unit/recorded/stragglers-*.json: real runs, timings as measured)."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).parent / "recorded" / f"stragglers-{name}.json").read_text())
    return [StepCompleted(time=t, host=doc["host"], attempt=0, rank=r, step=s, duration_seconds=d, phases=ph)
            for r, s, t, d, ph in doc["rows"]]


def test_a_contended_host_names_no_rank_of_a_healthy_job() -> None:
    # A healthy 2-rank run on a 2-core host with a CPU burner beside it: the scheduler made each rank late in
    # turn, in streaks of up to ~30 steps at 1.4-1.9x. Judged over two windows, both ranks were named in turn.
    recs = _recorded("contended-healthy")
    assert analyze(recs).stragglers == []
    assert {s.rank for s in analyze(recs, config=StragglerConfig(windows=2)).stragglers} == {0, 1}


def test_a_slow_rank_on_a_contended_host_is_still_named() -> None:
    # The same host and load, with rank 1 made 1.3x slower from step 40 (chaos slow): still named, and only it.
    (s,) = analyze(_recorded("contended-slow-rank1")).stragglers
    assert s.rank == 1 and 40 <= s.onset_step <= 60 and s.detected_step <= 40 + 60


# --- slow from the first step ----------------------------------------------------------------------
# A busy host's scheduler (``jitter``) often delays a healthy rank by more than a 1.3x rank's pause, so the rank is
# late in only ~2/3 of the steps: the onset rule's 75% of a 40-step span missed it (the demo's case, at load 3-7).


@pytest.mark.parametrize("seed", range(5))
def test_a_rank_slow_from_the_first_step_on_a_busy_host_is_named(seed: int) -> None:
    recs, _, _ = synth(ranks=4, steps=60, slow={2: 1.3}, onset=1, jitter=0.3, seed=seed)
    (s,) = analyze(recs).stragglers
    assert s.rank == 2 and s.onset_step <= 3 and s.detected_step <= 31 and s.last_step == 60
    assert 1.15 <= s.slowdown <= 1.4
    assert s.cost_seconds > 0 and s.step_seconds_without < s.step_seconds


@pytest.mark.parametrize("seed", range(3))
def test_a_rank_slow_from_the_first_step_is_named_from_the_first_31_steps(seed: int) -> None:
    # What the live watch has 30 steps after the onset.
    recs, _, _ = synth(ranks=4, steps=60, slow={2: 1.3}, onset=1, jitter=0.3, seed=seed)
    assert [s.rank for s in analyze([e for e in recs if e.step <= 31]).stragglers] == [2]
    # A buffer that no longer holds the attempt's start is not judged from the start.
    assert analyze([e for e in recs if e.step <= 31], from_start=False).stragglers == []


@pytest.mark.parametrize("seed", range(12))
def test_clean_busy_host_runs_flag_nobody_at_any_length(seed: int) -> None:
    recs, _, _ = synth(ranks=2 + seed % 7, steps=120, jitter=(0.1, 0.3, 0.5)[seed % 3], noise=0.03, spikes=0.05,
                       seed=seed)
    for last in (25, 31, 40, 60, 120):  # the live watch judges every prefix it has
        assert analyze([e for e in recs if e.step <= last]).stragglers == [], last


@pytest.mark.parametrize("seed", range(3))
def test_what_the_live_watch_named_from_the_start_is_not_taken_back_by_later_steps(seed: int) -> None:
    # Slow from step 1 to step 30, then on par (on a CI host at load, later windows drowned the pause the same
    # way): over the first 31 steps the rule holds and the watch names rank 2; over the whole run only 3 or 4 of 7
    # windows are late, and the run must still name it (it named nobody when the rule had to hold over all rows).
    recs, _, _ = synth(ranks=4, steps=60, slow={2: 1.3}, onset=1, until=30, jitter=0.3, seed=seed)
    assert [s.rank for s in analyze([e for e in recs if e.step <= 31]).stragglers] == [2]
    (s,) = analyze(recs).stragglers
    assert s.rank == 2 and s.onset_step <= 3 and s.detected_step <= 31


def test_a_rank_slow_from_the_first_step_of_a_loaded_demo_is_named_within_its_first_60_steps() -> None:
    # A real 3-rank demo at load 5.7 (8 CPU burners on 2 cores): rank 2's pause (~4 ms of a ~13 ms step) hides in
    # the scheduler's noise. The 3-sigma bar alone named it at step 102 of 120; once more than three windows are
    # in, the noise estimate is settled enough for the 2-sigma bar, and it is named by step 48.
    recs = _recorded("demo-slow-from-start-loaded")
    (s,) = analyze(recs).stragglers
    assert s.rank == 2 and s.onset_step <= 8 and s.detected_step <= 48
    assert [x.rank for x in analyze([e for e in recs if e.step <= 60]).stragglers] == [2]  # issue's 60-step demo


def test_one_window_drowned_by_the_scheduler_does_not_hide_a_rank_slow_from_the_first_step() -> None:
    # A real 4-rank demo recorded by a CI run (rank 2 1.3x slow from step 1): in its second window of 8 steps rank 2
    # was not late at all, and the rule then asked for all of the first three windows: nobody was named, at a
    # slowdown of 1.4. Now one of the first three may be lost to noise (the first must be late).
    (s,) = analyze(_recorded("demo-slow-from-start-ci")).stragglers
    assert s.rank == 2 and s.onset_step <= 8 and s.detected_step <= 41


def test_a_clean_demo_on_a_loaded_host_names_nobody_at_any_length() -> None:
    recs = _recorded("demo-clean-loaded")  # a real 3-rank demo, no fault, load 8.5
    for last in (25, 31, 33, 40, 48, 60, 90, 120):
        assert analyze([e for e in recs if e.step <= last]).stragglers == [], last


def test_a_rank_slowing_down_mid_run_keeps_its_onset() -> None:
    recs, _, _ = synth(ranks=4, steps=90, slow={2: 1.3}, onset=30, jitter=0.1, seed=1)
    (s,) = analyze(recs).stragglers
    assert s.rank == 2 and 22 <= s.onset_step <= 34


def test_steady_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        StragglerConfig(steady_min_slowdown=0.9)
    with pytest.raises(ValueError):
        StragglerConfig(steady_windows=0)
    with pytest.raises(ValueError):
        StragglerConfig(steady_settled_sigmas=4.0)  # never stricter than the first windows' bar
