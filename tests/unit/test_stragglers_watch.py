"""The agent's live straggler side: settings, naming once per rank, the exclusion policy, probe file handling;
and the goodput report's straggler bucket."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_stragglers import synth
from trainguard.accounting.goodput import compute_goodput
from trainguard.core.eventlog import EventWriter
from trainguard.core.events import Event, RunEnded, RunStarted, StragglerDetected
from trainguard.core.protocol import RunLayout
from trainguard.core.rundir import LoadedEvent
from trainguard.stragglers.watch import AgentWatch, WatchSettings


def test_settings_from_environment_and_bad_values_fall_back(caplog: pytest.LogCaptureFixture) -> None:
    s = WatchSettings.from_environ({"TRAINGUARD_STRAGGLER_POLICY": "exclude-next-restart",
                                    "TRAINGUARD_STRAGGLER_PROBE_SECONDS": "2.5", "TRAINGUARD_TELEMETRY_SECONDS": "0"})
    assert s == WatchSettings("exclude-next-restart", 2.5, 0.0)
    with caplog.at_level(logging.WARNING):
        bad = WatchSettings.from_environ({"TRAINGUARD_STRAGGLER_POLICY": "shoot",
                                          "TRAINGUARD_STRAGGLER_PROBE_SECONDS": "-1",
                                          "TRAINGUARD_TELEMETRY_SECONDS": "nan"})
    assert bad == WatchSettings()
    assert len(caplog.records) == 3


def _watch(tmp_path: Path, policy: str = "report", node: str = "h0") -> tuple[AgentWatch, list[Event]]:
    layout = RunLayout(tmp_path)
    layout.events_dir.mkdir(parents=True, exist_ok=True)
    emitted: list[Event] = []
    w = AgentWatch(layout, node, emitted.append, WatchSettings(policy, 1.0, 0.0), sources=[])
    w.on_attempt(0)
    return w, emitted


def _write_steps(tmp_path: Path, records: list[Event]) -> None:
    writers: dict[int, EventWriter] = {}
    for e in records:
        rank = getattr(e, "rank", 0)
        if rank not in writers:
            writers[rank] = EventWriter(RunLayout(tmp_path).rank_events(rank))
        writers[rank].write(e)
    for wr in writers.values():
        wr.close()


def test_a_straggler_is_named_once_with_the_policy_and_its_node_leaves_at_the_next_restart(tmp_path: Path) -> None:
    w, emitted = _watch(tmp_path, "exclude-next-restart")
    records, _, _ = synth(ranks=4, hosts=2, slow={3: 1.3}, onset=5)
    _write_steps(tmp_path, records)
    w._read_steps()
    first = w.check()
    assert [(r.rank, r.node, r.action) for r in first] == [(3, "h1", "exclude-next-restart")]
    assert w.check() == []  # named once per attempt
    with EventWriter(RunLayout(tmp_path).agent_events("h0")) as out:
        for r in emitted:
            out.write(r)
    # The slow rank's node fails its gate at the next attempt; the other node and the same attempt do not.
    other, _ = _watch(tmp_path, node="h1")
    assert other.exclusion_reasons(0) == []
    reasons = other.exclusion_reasons(1)
    assert len(reasons) == 1 and reasons[0].startswith("straggler: rank 3")
    assert w.exclusion_reasons(1) == []


def test_report_policy_never_excludes(tmp_path: Path) -> None:
    with EventWriter(RunLayout(tmp_path).agent_events("h0")) as out:
        out.write(StragglerDetected(time=1.0, attempt=0, rank=1, node="h0", action="report"))
    w, _ = _watch(tmp_path)
    assert w.exclusion_reasons(3) == []


def test_probe_moves_dumps_out_of_the_evidence_folder_and_drops_stacks(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    w, _ = _watch(tmp_path)
    evidence = RunLayout(tmp_path).diagnostics_dir(0)
    evidence.mkdir(parents=True)

    def fake_request(pid: int, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        rank = pid - 100
        (evidence / f"fr_trace_rank_{rank}.pkl").write_bytes(b"x")
        (evidence / f"stacks_rank_{rank}.txt").write_text("stack")
        return {"ok": True, "files": [f"fr_trace_rank_{rank}.pkl", f"stacks_rank_{rank}.txt", "../escape"]}

    monkeypatch.setattr("trainguard.worker.control.request", fake_request)
    assert w.probe({0: 100, 1: 101}) == 2
    assert list(evidence.iterdir()) == []  # a later failure's evidence cannot be mistaken for these
    assert sorted(p.name for p in w.probe_dir(0).iterdir()) == ["fr_trace_rank_0.pkl", "fr_trace_rank_1.pkl"]


def test_goodput_straggler_bucket_takes_the_cost_out_of_productive_time() -> None:
    records, _, added = synth(ranks=4, slow={2: 1.3}, onset=10)
    t0 = records[0].time - 1.0
    t1 = records[-1].time + 1.0
    run = [RunStarted(time=t0, run_id="r"), *records, RunEnded(time=t1, run_id="r", status="completed")]
    loaded = [LoadedEvent("x", i, e) for i, e in enumerate(run)]
    rep = compute_goodput(loaded)
    assert rep.badput_seconds["straggler"] == pytest.approx(added, rel=0.25)
    assert rep.productive_seconds + sum(rep.badput_seconds.values()) == pytest.approx(rep.wall_seconds, rel=1e-6)
    clean, _, _ = synth(ranks=4)
    rep = compute_goodput([LoadedEvent("x", i, e) for i, e in enumerate(
        [RunStarted(time=clean[0].time - 1, run_id="r"), *clean])])
    assert rep.badput_seconds["straggler"] == 0.0


def test_the_watch_names_a_rank_slow_from_the_first_step_within_30_steps(tmp_path: Path) -> None:
    # Busy host: the healthy ranks' scheduling delays often exceed the slow rank's pause (the demo at load 3-7).
    w, emitted = _watch(tmp_path)
    records, _, _ = synth(ranks=4, slow={2: 1.3}, onset=1, jitter=0.3, seed=3)
    named_at = None
    for step in range(1, 61):  # one check per step: the first that names it
        _write_steps(tmp_path, [e for e in records if getattr(e, "step", None) == step])
        w._read_steps()
        if w.check():
            named_at = step
            break
    assert named_at is not None and named_at <= 31
    assert [(r.rank, r.onset_step) for r in emitted if isinstance(r, StragglerDetected)] == [(2, 2)]


def test_a_job_shorter_than_the_check_interval_is_checked_when_it_completes(tmp_path: Path) -> None:
    w, emitted = _watch(tmp_path)
    records, _, _ = synth(ranks=4, slow={2: 1.3}, onset=1, jitter=0.3, seed=3)
    _write_steps(tmp_path, records)
    w.finish(leader=False)
    assert emitted == []  # only the leader judges
    w.finish(leader=True)
    assert [(r.rank, r.step <= 31) for r in emitted if isinstance(r, StragglerDetected)] == [(2, True)]
