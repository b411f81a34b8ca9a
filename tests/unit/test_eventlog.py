"""Event files: round trip, torn last line, skipped corrupt records and schema-version errors."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from trainguard.core.event_decoding import from_dict
from trainguard.core.eventlog import EventWriter, SkippedRecords, iter_events, read_events
from trainguard.core.events import RECORD_TYPES, FailureDetected, StepCompleted
from trainguard.errors import EventFormatError, InputError, SchemaVersionError


def test_round_trip_keeps_types_and_tuples(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    f = FailureDetected(time=1.5, host="h", attempt=2, kind="hang", ranks=(3, 1), hosts=("h",),
                        detection_latency_seconds=4.0, evidence=("a", "b"))
    s = StepCompleted(time=2.0, host="h", attempt=0, rank=1, step=7, duration_seconds=0.5,
                      phases={"data": 0.1}, loss=float("nan"))
    with EventWriter(path) as w:
        w.write(f)
        w.write(s)
    got = read_events(path)
    assert got[0] == f
    assert isinstance(got[1], StepCompleted) and got[1].loss is None  # NaN is stored as null
    assert got[1].phases == {"data": 0.1}


def test_every_record_type_round_trips() -> None:
    for name, cls in RECORD_TYPES.items():
        assert name == cls.TYPE
        required = {f: 0 for f in ("attempt", "rank", "step", "first_step", "last_step")}
        strings = {f: "x" for f in ("run_id", "status", "reason", "kind", "category", "policy", "path", "name",
                                    "severity", "node")}
        data = {"v": 1, "type": name, "time": 1.0, "duration_seconds": 1.0, "blocking_seconds": 0.1,
                "total_seconds": 0.2, "seconds": 0.3, "ok": True, **required, **strings}
        record = from_dict(data)
        assert from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_each_write_reaches_the_file_at_once(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    w = EventWriter(path)
    w.write(StepCompleted(time=1.0, attempt=0, rank=0, step=1, duration_seconds=1.0))
    # Not closed: another reader must already see the complete record.
    assert len(read_events(path)) == 1
    w.close()


def test_torn_last_line_is_skipped_with_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "w.jsonl"
    with EventWriter(path) as w:
        w.write(StepCompleted(time=1.0, attempt=0, rank=0, step=1, duration_seconds=1.0))
    with path.open("ab") as fh:
        fh.write(b'{"v":1,"type":"step_comp')
    with caplog.at_level(logging.WARNING):
        assert len(read_events(path)) == 1
    assert "torn" in caplog.text and "w.jsonl:2" in caplog.text


def test_garbage_in_the_middle_is_skipped_and_named(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text('{"v":1,"type":"run_started","time":1,"run_id":"r"}\nnot json\n{"v":1,"type":"run_ended",'
                    '"time":2,"run_id":"r","status":"completed"}\n')
    skipped = SkippedRecords()
    assert [r.TYPE for r in read_events(path, skipped=skipped)] == ["run_started", "run_ended"]
    assert [str(s) for s in skipped.items] == [f"{path}:2: not valid JSON"]
    with pytest.raises(EventFormatError, match=r"w\.jsonl:2: not valid JSON"):
        list(iter_events(path, strict=True))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('[1, 2]', "must be a JSON object"),
        ('{"type":"run_started","time":1,"run_id":"r"}', "schema version"),
        ('{"v":1,"type":"no_such_thing","time":1}', "unknown record type"),
        ('{"v":1,"type":"run_started","time":1}', "bad run_started record: missing field 'run_id'"),
        ('{"v":1,"type":"run_started","time":"noon","run_id":"r"}',
         "field 'time': expected a number, got a string"),
    ],
)
def test_malformed_records_are_skipped_or_rejected_when_strict(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text(line + "\n" + '{"v":1,"type":"run_started","time":1,"run_id":"r"}\n')
    skipped = SkippedRecords()
    assert len(read_events(path, skipped=skipped)) == 1
    assert skipped.total == 1 and skipped.items[0].line == 1 and message in skipped.items[0].reason
    with pytest.raises(EventFormatError, match=message):
        list(iter_events(path, strict=True))


def test_newer_schema_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text('{"v":99,"type":"run_started","time":1,"run_id":"r"}\n')
    with pytest.raises(SchemaVersionError, match="version 99 is newer"):
        list(iter_events(path))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such event file"):
        read_events(tmp_path / "nope.jsonl")


def test_unknown_optional_fields_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    path.write_text('{"v":1,"type":"run_started","time":1,"run_id":"r","added_later":true}\n')
    (record,) = read_events(path)
    assert record.TYPE == "run_started"
