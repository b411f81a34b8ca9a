"""Prometheus metrics of a run, read from its events as they are written (trainguard.web.metrics)."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainguard.accounting.goodput import compute_goodput
from trainguard.core import events as ev
from trainguard.core.rundir import RunDir
from trainguard.samples import SAMPLE_RUN
from trainguard.web.metrics import MetricsServer, RunCollector, RunMetrics, parse_listen

T0 = 1_767_000_000.0


def scrape(metrics: RunMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(RunCollector(metrics))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def steps(attempt: int, first: int, last: int, start: float) -> list[ev.Event]:
    return [ev.StepCompleted(time=start + i + 1, host="h0", attempt=attempt, rank=r, step=s, duration_seconds=1.0)
            for i, s in enumerate(range(first, last + 1)) for r in (0, 1)]


def test_metrics_follow_the_events_as_they_are_written(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run").create()
    now = [T0 + 12.0]
    m = RunMetrics(rd.root, node="h0", clock=lambda: now[0], ettr_every=0)
    with rd.writer("agent-h0") as w:
        w.write_all([ev.RunStarted(time=T0, host="h0", run_id="job", world_size=2),
                     ev.AttemptStarted(time=T0, host="h0", attempt=0, world_size=2), *steps(0, 1, 10, T0 + 1),
                     ev.CheckpointSaveStarted(time=T0 + 9.0, host="h0", attempt=0, rank=0, step=8),
                     ev.CheckpointSaveFinished(time=T0 + 10.5, host="h0", attempt=0, rank=0, step=8,
                                               blocking_seconds=0.25, total_seconds=1.5)])
    s = scrape(m)
    assert s[("trainguard_run_info", (("node", "h0"), ("run_id", "job")))] == 1
    assert s[("trainguard_step", ())] == 10
    assert s[("trainguard_steps_per_second", ())] == pytest.approx(10 / 12)  # 10 steps since the start, 12 s ago
    assert s[("trainguard_restarts_total", ())] == 0
    assert s[("trainguard_last_checkpoint_step", ())] == 8
    assert s[("trainguard_last_checkpoint_age_seconds", ())] == pytest.approx(1.5)
    assert s[("trainguard_last_checkpoint_save_seconds", ())] == 0.25
    assert s[("trainguard_last_checkpoint_commit_seconds", ())] == 1.5
    assert s[("trainguard_checkpoint_saves_total", (("outcome", "ok"),))] == 1

    # A crash: counted by kind at detection, by root cause once its attempt is over.
    with rd.writer("agent-h0") as w:
        w.write_all([ev.FailureDetected(time=T0 + 13, host="h0", attempt=0, kind="hang", ranks=(1,), hosts=("h1",),
                                        detection_latency_seconds=2.0, step=10)])
    now[0] = T0 + 13.5
    s = scrape(m)
    assert s[("trainguard_failures_detected_total", (("kind", "hang"),))] == 1
    assert not any(name == "trainguard_interruptions_total" for name, _ in s)
    with rd.writer("agent-h0") as w:
        w.write_all([ev.Diagnosis(time=T0 + 14, host="h0", attempt=0, category="Faulty GPU", group="GPU",
                                  culprit_hosts=("h1",), confidence=0.9),
                     ev.AttemptEnded(time=T0 + 14, host="h0", attempt=0, reason="failure"),
                     ev.NodeExcluded(time=T0 + 14, host="h0", node="h1", reason="culprit", attempt=0),
                     ev.AttemptStarted(time=T0 + 20, host="h0", attempt=1, world_size=2, resume_step=8)])
    now[0] = T0 + 21
    s = scrape(m)
    assert s[("trainguard_interruptions_total", (("category", "Faulty GPU"), ("group", "GPU")))] == 1
    assert s[("trainguard_restarts_total", ())] == 1
    assert s[("trainguard_attempt", ())] == 1
    assert s[("trainguard_step", ())] == 8  # the restored step until the new attempt completes one
    assert s[("trainguard_steps_per_second", ())] == 0  # nothing completed since the restart
    assert s[("trainguard_suspected_total", (("host", "h1"), ("reason", "culprit")))] == 1
    assert s[("trainguard_suspected_total", (("host", "h1"), ("reason", "excluded")))] == 1

    # ETTR so far is the report's over the same records.
    report = compute_goodput(rd.root)
    assert s[("trainguard_ettr_ratio", ())] == pytest.approx(report.ettr)
    assert s[("trainguard_badput_seconds", (("bucket", "detection"),))] == pytest.approx(
        report.badput_seconds["detection"])


def test_a_finished_run_gives_the_reports_numbers() -> None:
    s = scrape(RunMetrics(SAMPLE_RUN, ettr_every=0))
    report = compute_goodput(SAMPLE_RUN)
    assert s[("trainguard_ettr_ratio", ())] == report.ettr
    assert s[("trainguard_wall_seconds", ())] == report.wall_seconds
    assert s[("trainguard_restarts_total", ())] == report.attempts - 1
    by_cause = {dict(labels)["category"]: v for (name, labels), v in s.items()
                if name == "trainguard_interruptions_total"}
    assert by_cause == {"GPU HBM3 Memory": 1, "NCCL Watchdog Timeouts": 1, "Planned": 1}


def test_metric_names_follow_the_prometheus_convention() -> None:
    s = scrape(RunMetrics(SAMPLE_RUN, ettr_every=0))
    for name, _ in s:
        assert name.startswith("trainguard_"), name
    registry = CollectorRegistry()
    registry.register(RunCollector(RunMetrics(SAMPLE_RUN)))
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        if fam.type == "counter":
            assert all(x.name.endswith(("_total", "_created")) for x in fam.samples), fam.name
        if "seconds" in fam.name or "ratio" in fam.name:
            assert fam.name.endswith(("_seconds", "_ratio", "_per_second")), fam.name


@pytest.mark.parametrize(("text", "expected"), [("9400", ("127.0.0.1", 9400)), ("0.0.0.0:9400", ("0.0.0.0", 9400)),
                                                 ("[::1]:0", ("::1", 0))])
def test_listen_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "70000", "host:", ":-1"])
def test_bad_listen_address(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_listen(text)


def test_the_server_serves_the_run(tmp_path: Path) -> None:
    server = MetricsServer("127.0.0.1", 0)
    try:
        server.follow(SAMPLE_RUN, "n0")
        host, port = server.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        assert 'trainguard_run_info{node="n0",run_id="sample-run"} 1.0' in text
        assert "trainguard_step 600.0" in text
    finally:
        server.close()


def test_a_taken_port_is_refused_before_the_run_directory_exists(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "trainguard", "run", "--metrics-port", str(port), "--run-dir",
                              str(tmp_path / "r"), "--no-health-checks", "train.py"],
                             capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2, res.stderr
    assert "--metrics-port" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_bad_metrics_port_is_a_usage_error(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "trainguard", "run", "--metrics-port", "nope", "train.py"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and "--metrics-port" in res.stderr


def test_memory_tier_copies_are_counted_apart_from_storage_saves(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run").create()
    m = RunMetrics(rd.root, node="h0", clock=lambda: T0 + 20.0, ettr_every=0)
    with rd.writer("rank-0") as w:
        w.write_all([ev.RunStarted(time=T0, host="h0", run_id="job", world_size=1),
                     ev.CheckpointSaveStarted(time=T0 + 4.0, host="h0", attempt=0, rank=0, step=4),
                     ev.CheckpointSaveFinished(time=T0 + 6.0, host="h0", attempt=0, rank=0, step=4,
                                               blocking_seconds=0.5, total_seconds=2.0),
                     *[rec for step in (4, 8, 12) for rec in (
                         ev.CheckpointSaveStarted(time=T0 + step + 0.5, host="h0", attempt=0, rank=0, step=step,
                                                  tier="memory"),
                         ev.CheckpointSaveFinished(time=T0 + step + 0.8, host="h0", attempt=0, rank=0, step=step,
                                                   blocking_seconds=0.1, total_seconds=0.3, tier="memory",
                                                   ok=step != 12, error="" if step != 12 else "replica failed"))]])
    s = scrape(m)
    assert s[("trainguard_checkpoint_saves_total", (("outcome", "ok"),))] == 1
    assert s[("trainguard_checkpoint_saves_total", (("outcome", "failed"),))] == 0
    assert s[("trainguard_last_checkpoint_step", ())] == 4  # storage's newest, not the memory copy of step 8
    assert s[("trainguard_last_checkpoint_age_seconds", ())] == pytest.approx(14.0)
    assert s[("trainguard_last_checkpoint_save_seconds", ())] == 0.5
    assert s[("trainguard_memory_checkpoint_saves_total", (("outcome", "ok"),))] == 2
    assert s[("trainguard_memory_checkpoint_saves_total", (("outcome", "failed"),))] == 1
    assert s[("trainguard_last_memory_checkpoint_step", ())] == 8
    assert s[("trainguard_last_memory_checkpoint_age_seconds", ())] == pytest.approx(20.0 - 8.8)
    assert s[("trainguard_last_memory_checkpoint_save_seconds", ())] == 0.1
    assert s[("trainguard_last_memory_checkpoint_commit_seconds", ())] == 0.3
