"""`trainguard report` and `trainguard index` from the command line, good and bad input."""

from __future__ import annotations

import json
import os
import shutil
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
    assert "no usable events (2 bad records skipped" in r.err and "rank-0.jsonl:1: not valid UTF-8" in r.err


def _sample_copy(tmp_path: Path) -> Path:
    root = tmp_path / "sample-run"
    shutil.copytree(SAMPLE_RUN, root)
    return root


def _edit_line(path: Path, line: int, edit) -> None:  # type: ignore[no-untyped-def]
    lines = path.read_bytes().splitlines(keepends=True)
    lines[line - 1] = edit(lines[line - 1])
    path.write_bytes(b"".join(lines))


def test_a_torn_record_in_the_middle_is_skipped_and_reported(tmp_path: Path) -> None:
    """Issue 11: a full disk tore record 30 and the next append joined onto it: the run was refused."""
    root = _sample_copy(tmp_path)
    _edit_line(root / "events" / "rank-0.jsonl", 30, lambda b: b[: len(b) // 2])
    r = trainguard("report", str(root), "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["skipped_records_total"] == 1
    assert data["skipped_records"][0]["path"].endswith("rank-0.jsonl") and data["skipped_records"][0]["line"] == 30
    text = trainguard("report", str(root))
    assert text.code == 0 and "warning: 1 unreadable record(s) skipped (first: " in text.out
    assert "rank-0.jsonl:30: not valid JSON" in text.out


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (b'"attempt":0', b'"attempt":1000000000', "attempt 1000000000 was never started"),
        (b'"duration_seconds":', b'"duration_seconds":-1e9,"was":', "negative duration_seconds"),
    ],
    ids=["attempt", "negative-duration"],
)
def test_one_implausible_record_does_not_rewrite_the_headline(tmp_path: Path, old: bytes, new: bytes,
                                                               reason: str) -> None:
    """Issue 11: these turned ETTR 74.4% into 5.9% and 81.9% with exit 0 and no warning."""
    root = _sample_copy(tmp_path)
    _edit_line(root / "events" / "rank-2.jsonl", 40, lambda b: b.replace(old, new, 1))
    r = trainguard("report", str(root))
    assert r.code == 0, r.err
    assert "effective training time (ETTR): 74.4%" in r.out
    assert "warning: 1 implausible record(s) excluded from the accounting (first: rank-2:40" in r.out
    data = json.loads(trainguard("report", str(root), "--json").out)
    assert data["excluded_records_total"] == 1 and reason in data["excluded_records"][0]["reason"]


@pytest.mark.parametrize(
    "bad",
    [
        b'{"v":1,"type":"step_completed","time":1767000100,"attempt":0,"rank":0,"step":"7","duration_seconds":1}',
        b'{"v":1,"type":"step_completed","time":1767000100,"attempt":[0],"rank":0,"step":7,"duration_seconds":1}',
        b'{"v":1,"type":"attempt_ended","time":1767000100,"attempt":0,"reason":"x","host":{"a":1}}',
        b'{"v":1,"type":"step_completed","time":1767000100,"attempt":0,"rank":true,"step":7,"duration_seconds":1}',
        b'{"v":1,"type":"step_completed","time":NaN,"attempt":0,"rank":0,"step":7,"duration_seconds":1}',
        b'{"v":1,"type":"step_completed","time":1e999,"attempt":0,"rank":0,"step":7,"duration_seconds":1}',
        b'{"v":1,"type":"run_started","time":1767000000,"run_id":"r","config":' + b"[" * 100_000 + b"]" * 100_000
        + b"}",
        b'{"v":1,"type":"step_completed","time":1767000100,"attempt":0,"rank":0,"step":' + b"7" * 5000
        + b',"duration_seconds":1}',
    ],
    ids=["str-step", "list-attempt", "dict-host", "bool-rank", "nan", "inf", "deep", "5000-digits"],
)
def test_wrong_types_are_skipped_never_internal_errors(tmp_path: Path, bad: bytes) -> None:
    """Issue 11: these ended in exit 70 ("internal error")."""
    root = _sample_copy(tmp_path)
    _edit_line(root / "events" / "agent-node-a.jsonl", 3, lambda b: bad + b"\n" + b)
    r = trainguard("report", str(root), "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["skipped_records_total"] == 1 and data["skipped_records"][0]["line"] == 3
    p = trainguard("plan", "--from-run", str(root), "--trials", "1", "--days", "1", "--gpus", "64", "--json")
    assert p.code == 0, p.err


def test_plan_ignores_implausible_calibration_figures(tmp_path: Path) -> None:
    """A negative save stall or a step of 5e-324 s measured from corrupt records was an exit 2 or 70."""
    root = _sample_copy(tmp_path)
    for name in (f"rank-{r}.jsonl" for r in range(8)):
        path = root / "events" / name
        path.write_bytes(path.read_bytes().replace(b'"blocking_seconds":0.2', b'"blocking_seconds":-1e9,"was":0.2')
                         .replace(b'"duration_seconds":0.', b'"duration_seconds":5e-324,"was":0.'))
    p = trainguard("plan", "--from-run", str(root), "--trials", "1", "--days", "1", "--gpus", "64", "--json")
    assert p.code == 0, p.err
    assert "implausible; the option's value is used instead" in p.err


def test_a_fifo_among_the_event_files_does_not_hang_the_report(tmp_path: Path) -> None:
    root = _sample_copy(tmp_path)
    os.mkfifo(root / "events" / "x.jsonl")
    r = trainguard("report", str(root), "--json", timeout=60)
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["skipped_records"][0]["path"].endswith("x.jsonl") and "FIFO" in data["skipped_records"][0]["reason"]


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


def test_html_writes_the_file_and_prints_no_terminal_report(tmp_path: Path) -> None:
    import importlib.util

    if not (importlib.util.find_spec("jinja2") and importlib.util.find_spec("plotly")):
        pytest.fail("the web extra (jinja2, plotly) is part of the test environment")
    page = tmp_path / "r.html"
    res = trainguard("report", str(SAMPLE_RUN), "--html", str(page))
    assert res.code == 0, res.err
    assert page.read_text().startswith("<!DOCTYPE html") or "<html" in page.read_text()[:500]
    assert res.out == ""
    assert res.err.strip().splitlines() == [f"trainguard report: HTML report written to {page}"]
