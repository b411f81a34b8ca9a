"""One simulated trial written as a run directory: standard records that `report` accounts alike."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from trainguard.core.events import (
    CheckpointLoaded,
    CheckpointSaveFinished,
    Diagnosis,
    FailureDetected,
    NodeExcluded,
    PlannedInterruption,
    RunEnded,
    RunStarted,
    StepCompleted,
    StepSpan,
)
from trainguard.core.rundir import RunDir
from trainguard.sim.events_out import write_trial
from trainguard.sim.models import TABLE5_GROUPS, load_model
from trainguard.sim.policy import JobConfig, PolicyConfig


@pytest.fixture(scope="module")
def llama_trial(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("sim") / "run"
    policy = PolicyConfig(checkpoint_total_seconds=150)
    written = write_trial(path, load_model("llama3"), JobConfig(gpus=16384, days=14), policy, seed=3)
    return path, written, [e.record for e in RunDir(path).load()]


def test_records_describe_the_trial(llama_trial) -> None:
    _, written, records = llama_trial
    kinds = Counter(type(r) for r in records)
    assert kinds[RunStarted] == 1 and kinds[RunEnded] == 1
    start = next(r for r in records if isinstance(r, RunStarted))
    assert start.synthetic and start.world_size == 16384 and start.nnodes == 2048
    failures = [r for r in records if isinstance(r, FailureDetected)]
    planned = [r for r in records if isinstance(r, PlannedInterruption)]
    assert len(failures) + len(planned) == written.interruptions > 50
    assert all(h.startswith("node-") for f in failures for h in f.hosts)
    diag = [r for r in records if isinstance(r, Diagnosis)]
    assert len(diag) == len(failures)
    assert all(TABLE5_GROUPS[d.category] == d.group for d in diag)
    assert kinds[NodeExcluded] > 0 and kinds[CheckpointLoaded] > 0
    assert kinds[StepCompleted] == 0


def test_steps_are_spans_between_boundaries_not_one_record_per_step(llama_trial) -> None:
    _, _, records = llama_trial
    spans = [r for r in records if isinstance(r, StepSpan)]
    steps = sum(s.last_step - s.first_step + 1 for s in spans)
    assert steps > 50 * len(spans)
    saves = [r for r in records if isinstance(r, CheckpointSaveFinished) and r.ok]
    # periodic async saves stall 60 s and are durable 150 s after they start; the save before a
    # planned stop blocks until durable
    regular = [s for s in saves if s.blocking_seconds == pytest.approx(60.0)]
    assert all(s.total_seconds == pytest.approx(150.0) for s in regular)
    assert all(s.blocking_seconds == pytest.approx(s.total_seconds) for s in saves if s not in regular)
    assert len(regular) > 0.9 * len(saves)
    # after restoring step S, the next span starts at S + 1
    loaded = {r.attempt: r.step for r in records if isinstance(r, CheckpointLoaded)}
    first = {}
    for s in spans:
        first.setdefault(s.attempt, s.first_step)
    assert all(first[a] == step + 1 for a, step in loaded.items() if a in first)


def test_goodput_of_the_written_trial_matches_the_simulator(llama_trial) -> None:
    from trainguard.accounting.goodput import compute_goodput

    path, written, _ = llama_trial
    report = compute_goodput(path)
    ettr = report.productive_seconds / report.wall_seconds
    assert report.wall_seconds == pytest.approx(14 * 86400)
    assert abs(ettr - written.ettr) <= 0.005 * written.ettr


def test_small_job_lists_its_hosts_in_every_attempt(tmp_path: Path) -> None:
    written = write_trial(tmp_path / "r", load_model("rsc1"), JobConfig(gpus=64, days=30), PolicyConfig(), seed=1)
    records = [e.record for e in RunDir(written.path).load()]
    attempts = [r for r in records if type(r).__name__ == "AttemptStarted"]
    assert all(len(a.hosts) == 8 for a in attempts)


def test_power_series_of_the_trial(llama_trial) -> None:
    from trainguard.telemetry.power_model import PowerModel

    path, written, _ = llama_trial
    rows = [line.split(",") for line in (path / "sim" / "power.csv").read_text().splitlines()[1:]]
    times = [float(t) for t, _ in rows]
    levels = {round(float(mw), 6) for _, mw in rows}
    assert times == sorted(times) and times[0] == 0.0
    p = PowerModel()
    expected = {round(16384 * watts / 1e6, 6) for watts in
                (p.step_average_watts, p.collective_wait_watts, p.checkpointing_watts, p.restarting_watts)}
    assert levels <= expected and len(levels) >= 3
    assert written.power_swing_mw == pytest.approx(16384 * (p.step_average_watts - p.restarting_watts) / 1e6)


def test_a_trial_with_inprocess_warm_and_memory_recovery_reports_alike(tmp_path: Path) -> None:
    """Recovery schemes change only phase lengths, so `report` still accounts the written trial as the
    simulator did; in-process recoveries have no CheckpointLoaded (their restore is inside the restart)."""
    from trainguard.accounting.goodput import compute_goodput

    policy = PolicyConfig(checkpoint_total_seconds=90, inprocess_share=0.5, inprocess_restart_seconds=8,
                          warm_start_seconds=20, memory_checkpoint="peer", memory_restore_seconds=2)
    plain = write_trial(tmp_path / "plain", load_model("llama3"), JobConfig(gpus=16384, days=7), PolicyConfig(
        checkpoint_total_seconds=90), seed=5)
    written = write_trial(tmp_path / "run", load_model("llama3"), JobConfig(gpus=16384, days=7), policy, seed=5)
    report = compute_goodput(tmp_path / "run")
    assert abs(report.productive_seconds / report.wall_seconds - written.ettr) <= 0.005 * written.ettr
    assert written.ettr > plain.ettr + 0.03  # restarts of 8-140 s instead of 600 s, about 54 of them
    records = [e.record for e in RunDir(tmp_path / "run").load()]
    loads = [e for e in records if isinstance(e, CheckpointLoaded)]
    # from a peer's memory copy (2 s) or, for network, SDC and planned stops, from storage (120 s; a
    # restore cut short by the next failure is shorter)
    seconds = {round(e.seconds, 6) for e in loads}
    assert {2.0, 120.0} <= seconds and max(seconds) <= 120.0
    assert sum(isinstance(e, FailureDetected) for e in records) > len(loads)  # in-process: no load record
