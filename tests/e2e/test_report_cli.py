"""`trainguard report` and `trainguard index` from the command line, good and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import assert_one_line_error, trainguard
from trainguard.samples import SAMPLE_RUN


def test_report_on_the_bundled_sample() -> None:
    r = trainguard("report", str(SAMPLE_RUN))
    assert r.code == 0, r.err
    assert "SYNTHETIC" in r.out and "ETTR" in r.out and "GPU HBM3 Memory" in r.out


def test_report_json_buckets_add_up() -> None:
    r = trainguard("report", str(SAMPLE_RUN), "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["synthetic"] is True and data["completed_steps"] == 600
    total = data["productive_seconds"] + sum(data["badput_seconds"].values())
    assert total == pytest.approx(data["wall_seconds"], rel=1e-3)
    assert [i["kind"] for i in data["interruptions"]] == ["crash", "hang", "planned"]
    assert data["interruptions"][0]["culprit_hosts"] == ["node-b"]
    # node-b's clock runs 0.35 s ahead in the sample; the report must find that.
    assert data["clock_offsets_seconds"]["node-b"] == pytest.approx(0.35, abs=1e-3)


def _events_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run" / "events"
    d.mkdir(parents=True)
    return d


def test_missing_dir(tmp_path: Path) -> None:
    assert_one_line_error(trainguard("report", str(tmp_path / "nope")), 3)


def test_not_a_run_dir(tmp_path: Path) -> None:
    assert_one_line_error(trainguard("report", str(tmp_path)), 3)


def test_empty_events(tmp_path: Path) -> None:
    _events_dir(tmp_path)
    r = trainguard("report", str(tmp_path / "run"))
    assert_one_line_error(r, 3)
    assert "no events" in r.err


def test_garbage_json(tmp_path: Path) -> None:
    (_events_dir(tmp_path) / "rank-0.jsonl").write_bytes(b"\x00\xff garbage\n{}\n")
    r = trainguard("report", str(tmp_path / "run"))
    assert_one_line_error(r, 3)
    assert "rank-0.jsonl:1" in r.err


def test_unknown_schema_version(tmp_path: Path) -> None:
    (_events_dir(tmp_path) / "agent.jsonl").write_text('{"v":7,"type":"run_started","time":1,"run_id":"x"}\n')
    r = trainguard("report", str(tmp_path / "run"), "--json")
    assert_one_line_error(r, 3)
    assert "newer" in r.err and r.out == ""


def test_usage_error_exit_code() -> None:
    r = trainguard("report")
    assert r.code == 2 and "Traceback" not in r.err


def test_index_then_reindex(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    first = trainguard("index", str(SAMPLE_RUN), "--db", str(db), "--json")
    assert first.code == 0, first.err
    data = json.loads(first.out)
    assert data["runs"][0]["new_events"] == data["total_events"] > 0
    again = json.loads(trainguard("index", str(SAMPLE_RUN), "--db", str(db), "--json").out)
    assert again["runs"][0]["new_events"] == 0 and again["total_events"] == data["total_events"]


def test_index_reports_bad_runs_and_indexes_the_rest(tmp_path: Path) -> None:
    r = trainguard("index", str(tmp_path / "missing"), str(SAMPLE_RUN), "--db", str(tmp_path / "f.db"))
    assert r.code == 3 and "Traceback" not in r.err and "missing" in r.err
    assert "events in all" in r.out


def test_index_into_unwritable_location(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = trainguard("index", str(SAMPLE_RUN), "--db", str(blocker / "sub" / "fleet.db"))
    assert_one_line_error(r, 4)
