"""Goodput accounting against hand-computed answers (see streams.py for the arithmetic)."""

from __future__ import annotations

import pytest

from tests.unit.streams import CASES, Case
from trainguard.goodput import BUCKETS, compute_goodput
from trainguard.rundir import RunDir


def _write(run_dir: RunDir, case: Case) -> None:
    for name, records in case.writers.items():
        with run_dir.writer(name) as w:
            w.write_all(records)


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_buckets_match_hand_computed_answers(run_dir: RunDir, make) -> None:
    case = make()
    _write(run_dir, case)
    report = compute_goodput(run_dir)
    assert report.wall_seconds == pytest.approx(case.wall, abs=1e-6)
    assert report.productive_seconds == pytest.approx(case.expected["productive"], abs=1e-6)
    for bucket in BUCKETS:
        assert report.badput_seconds[bucket] == pytest.approx(case.expected.get(bucket, 0.0), abs=1e-6), bucket
    total = report.productive_seconds + sum(report.badput_seconds.values())
    assert total == pytest.approx(report.wall_seconds, rel=1e-3)
    assert report.ettr == pytest.approx(case.expected["productive"] / case.wall, abs=1e-6)


def test_interruption_table_names_cause_and_time_lost(run_dir: RunDir) -> None:
    from tests.unit.streams import crash_mid_step

    _write(run_dir, crash_mid_step())
    report = compute_goodput(run_dir)
    (i,) = report.interruptions
    assert (i.kind, i.attempt, i.category, i.group, i.culprit_ranks) == ("crash", 0, "Faulty GPU", "GPU", (1,))
    # lost 2.5 + detection 0.1 + restart 0.9 + next start-up 1.0 + restore 1.0
    assert i.time_lost_seconds == pytest.approx(5.5)
    assert i.time_seconds == pytest.approx(8.1)
    assert report.root_causes == [
        {"category": "Faulty GPU", "group": "GPU", "count": 1, "share": 1.0, "time_lost_seconds": pytest.approx(5.5)}
    ]
    assert report.completed_steps == 10 and report.attempts == 2


def test_skew_is_measured_and_reported(run_dir: RunDir) -> None:
    from tests.unit.streams import skewed_hosts

    _write(run_dir, skewed_hosts())
    report = compute_goodput(run_dir)
    assert report.clock_offsets_seconds == {"h1": pytest.approx(120.0)}
    assert any("h1" in w for w in report.warnings)


def test_torn_last_line_is_tolerated_with_same_answer(run_dir: RunDir, caplog) -> None:
    from tests.unit.streams import crash_mid_step

    case = crash_mid_step()
    _write(run_dir, case)
    with open(run_dir.events_dir / "ranks.jsonl", "ab") as fh:
        fh.write(b'{"v":1,"type":"step_completed","time":17000')  # writer killed mid-record
    report = compute_goodput(run_dir)
    assert report.productive_seconds == pytest.approx(10.0)
    assert "torn" in caplog.text


def test_run_without_end_is_accounted_to_last_event(run_dir: RunDir) -> None:
    from tests.unit.streams import clean_run

    case = clean_run()
    case.writers["agent-h0"].pop()  # drop RunEnded
    _write(run_dir, case)
    report = compute_goodput(run_dir)
    assert report.status == "incomplete"
    assert report.wall_seconds == pytest.approx(12.8)  # AttemptEnded is the last event
    assert report.badput_seconds["other"] == pytest.approx(0.3)


def test_json_form_has_the_documented_keys(run_dir: RunDir) -> None:
    from tests.unit.streams import crash_mid_step

    _write(run_dir, crash_mid_step())
    data = compute_goodput(run_dir).to_json()
    assert 0 <= data["ettr"] <= 1
    assert set(data["badput_seconds"]) == set(BUCKETS)
    for key in ("wall_seconds", "productive_seconds", "interruptions", "steps_per_second", "root_causes"):
        assert key in data
    assert data["interruptions"][0]["culprit_ranks"] == [1]
