"""Goodput accounting against hand-computed answers (see streams.py for the arithmetic)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.unit.streams import CASES, Case
from trainguard.accounting.goodput import BUCKETS, compute_goodput
from trainguard.core.events import RunEnded
from trainguard.core.rundir import RunDir
from trainguard.samples import SAMPLE_RUN


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


def test_torn_last_line_is_tolerated_with_same_answer(run_dir: RunDir) -> None:
    from tests.unit.streams import crash_mid_step

    case = crash_mid_step()
    _write(run_dir, case)
    with open(run_dir.events_dir / "ranks.jsonl", "ab") as fh:
        fh.write(b'{"v":1,"type":"step_completed","time":17000')  # writer killed mid-record
    report = compute_goodput(run_dir)
    assert report.productive_seconds == pytest.approx(10.0)
    assert report.skipped_records_total == 1 and "torn" in report.skipped_records[0].reason
    assert any("skipped" in w for w in report.warnings)


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


def _sample_copy(tmp_path: Path) -> Path:
    root = tmp_path / "sample-run"
    shutil.copytree(SAMPLE_RUN, root)
    return root


def _insert(path: Path, at: int, record: dict[str, object]) -> None:
    """Put one record line before line ``at`` (1-based) of an event file."""
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(at - 1, (json.dumps(record) + "\n").encode())
    path.write_bytes(b"".join(lines))


SAMPLE_ETTR = 0.7438964325858284
T_SAMPLE = 1_767_000_000.0
_STEP = {"v": 1, "type": "step_completed", "time": T_SAMPLE + 100, "host": "node-a", "attempt": 0, "rank": 0,
         "step": 50, "duration_seconds": 0.9}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"attempt": 1_000_000_000}, "attempt 1000000000 was never started"),
        ({"duration_seconds": -1e9}, "negative duration_seconds"),
        ({"duration_seconds": 1e7}, "duration_seconds 1e+07 s longer than the whole run"),
        ({"step": 10**12}, "step 1000000000000 absurdly beyond the others"),
        ({"time": T_SAMPLE + 1e9}, "outside the span of the run's records"),
        ({"time": 5.0}, "outside the span of the run's records"),
        ({"rank": 20_000_000}, "rank 20000000 beyond 10,000,000"),
    ],
    ids=["attempt", "negative-duration", "long-duration", "step", "future", "epoch", "rank"],
)
def test_one_implausible_record_is_excluded_visibly(tmp_path: Path, change: dict[str, object], reason: str) -> None:
    root = _sample_copy(tmp_path)
    _insert(root / "events" / "rank-3.jsonl", 300, {**_STEP, **change})
    report = compute_goodput(root)
    assert report.ettr == pytest.approx(SAMPLE_ETTR, abs=1e-9)  # the headline is not rewritten
    assert report.excluded_records_total == 1
    (ex,) = report.excluded_records
    assert (ex.writer, ex.line, ex.type) == ("rank-3", 300, "step_completed") and reason in ex.reason
    assert any("1 implausible record(s) excluded" in w for w in report.warnings)
    data = report.to_json()
    assert data["excluded_records_total"] == 1 and data["excluded_records"][0]["line"] == 300


def test_a_node_fault_with_the_node_rank_marker_is_kept_but_other_negative_ranks_are_not(tmp_path: Path) -> None:
    root = _sample_copy(tmp_path)
    fault = {"v": 1, "type": "fault_injected", "time": T_SAMPLE + 100, "host": "node-a", "attempt": 0, "step": 0,
             "kind": "node-crash", "params": {"node": "node-a"}}
    agent = root / "events" / "agent-node-a.jsonl"
    _insert(agent, 3, {**fault, "rank": -1})  # rank -1: the documented marker of a whole node's fault
    _insert(agent, 3, {**fault, "rank": -2})
    report = compute_goodput(root)
    assert [e.reason for e in report.excluded_records] == ["negative rank (-2)"]


def test_implausible_run_bounds_and_world_size_are_excluded(tmp_path: Path) -> None:
    root = _sample_copy(tmp_path)
    agent = root / "events" / "agent-node-a.jsonl"
    _insert(agent, 2, {"v": 1, "type": "attempt_started", "time": T_SAMPLE + 1, "host": "node-a",
                       "attempt": 77_777, "world_size": 8})
    _insert(agent, 2, {"v": 1, "type": "run_started", "time": T_SAMPLE, "host": "node-a", "run_id": "x",
                       "world_size": 50_000_000})
    report = compute_goodput(root)
    reasons = sorted(e.reason for e in report.excluded_records)
    assert reasons == ["attempt 77777 far beyond the 5 attempts started", "world_size 50000000 beyond 10,000,000"]
    assert report.ettr == pytest.approx(SAMPLE_ETTR, abs=1e-9)


def test_a_run_end_before_its_start_is_excluded(run_dir: RunDir) -> None:
    from tests.unit.streams import T0, clean_run

    case = clean_run()
    case.writers["agent-h0"].append(RunEnded(time=T0 - 5, host="h0", run_id="clean", status="completed"))
    case.writers["agent-h0"].pop(-2)  # the true end
    _write(run_dir, case)
    report = compute_goodput(run_dir)
    assert [e.reason for e in report.excluded_records] == ["ends before the run started"]
    assert report.status == "incomplete" and report.wall_seconds == pytest.approx(12.8)


def test_bad_records_in_the_middle_are_skipped_and_listed(tmp_path: Path) -> None:
    root = _sample_copy(tmp_path)
    path = root / "events" / "rank-0.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[29] = lines[29][: len(lines[29]) // 2]  # torn, and glued to the next (old writer, full disk)
    lines[99] = lines[99].replace(b'"step":', b'"step":"x","was":')  # a string step
    path.write_bytes(b"".join(lines))
    report = compute_goodput(root)
    assert report.skipped_records_total == 2
    assert [(s.line, s.reason) for s in report.skipped_records] == [
        (30, "not valid JSON"), (99, "bad step_completed record: field 'step': expected an integer, got a string")]
    assert report.ettr == pytest.approx(SAMPLE_ETTR, abs=2e-3)  # rank 0 lost three of its 714 records
    assert report.to_json()["skipped_records"][0]["path"].endswith("rank-0.jsonl")


def test_each_interruption_says_its_lost_steps_lost_progress_and_whole_cost_apart() -> None:
    report = compute_goodput(SAMPLE_RUN)
    rows = [(i.kind, i.step, i.lost_steps) for i in report.interruptions]
    # The sample's crash after step 137 resumed from the checkpoint of step 100, its hang after 290 from 250, and
    # the attempt after the planned stop from 450, 10 steps before where the run had got to.
    assert rows == [("crash", 137, 37), ("hang", 290, 40), ("planned", None, 10)], rows
    # Lost progress is the part of each whole cost that was training redone; together they are the bucket.
    assert all(0 < i.lost_progress_seconds < i.time_lost_seconds for i in report.interruptions)
    assert sum(i.lost_progress_seconds for i in report.interruptions) == pytest.approx(
        report.badput_seconds["lost_progress"])
    row = report.to_json()["interruptions"][0]
    assert {"lost_steps", "lost_progress_seconds", "time_lost_seconds"} <= set(row)


def test_lost_steps_are_unknown_without_a_resume_point_and_none_for_an_attempt_without_steps() -> None:
    from trainguard.accounting import resume
    from trainguard.accounting.resume import lost_steps

    steps = [resume.AttemptSteps(0, "script", 1, 30), resume.AttemptSteps(2, "attempt", 1, 12)]
    points = resume.infer(steps, {})
    assert points[2].step is None  # counted per attempt from 1 again, nothing says where it resumed
    assert lost_steps(steps, points, {0: 0, 2: 30}) == {0: None}
    points = resume.infer(steps, {2: 20})  # its checkpoint_loaded record: step 20
    assert lost_steps(steps, points, {0: 0, 2: 0}) == {0: 10}
