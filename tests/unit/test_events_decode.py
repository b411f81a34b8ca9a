"""Strict decoding of records: every field is checked against its declared type, and the reader
turns wrong types, deep JSON and huge numbers into skipped records naming file, line and field."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import pytest

from trainguard.core.event_decoding import INT_LIMIT, RecordError, from_dict
from trainguard.core.eventlog import SkippedRecords, read_events
from trainguard.core.events import RECORD_TYPES, StepCompleted


def _valid(cls: type) -> dict[str, Any]:
    """A minimal valid JSON form of a record type (every required field filled in)."""
    out: dict[str, Any] = {"v": 1, "type": cls.TYPE}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        hint = hints[f.name]
        out[f.name] = {int: 1, float: 1.5, str: "x", bool: True}[hint]
    return out


def _wrong_values(hint: Any) -> list[Any]:
    """JSON values that must not pass for a field of this type."""
    wrong: list[Any] = [{"a": 1}, [[1]]]
    base = hint
    args = typing.get_args(hint)
    if type(None) in args:
        base = next(a for a in args if a is not type(None))
    else:
        wrong.append(None)
    if base is int:
        wrong += ["3", True, 1.5, INT_LIMIT + 1, [1]]
    elif base is float:
        wrong += ["3", False, [1.0], INT_LIMIT * 4]
    elif base is str:
        wrong += [3, True, ["x"], "\ud800"]
    elif base is bool:
        wrong += [1, "true", 0.0]
    elif typing.get_origin(base) is tuple:
        wrong += ["x", 3, [{"a": 1}], [True] if typing.get_args(base)[0] is int else [3]]
    elif typing.get_origin(base) is dict:
        wrong = [[1], "x", 3] + ([{"k": "x"}] if typing.get_args(base)[1] is float else [])
        if type(None) not in args:
            wrong.append(None)
    return wrong


CASES = [
    (cls, f.name, value)
    for cls in RECORD_TYPES.values()
    for f in dataclasses.fields(cls)
    for value in _wrong_values(typing.get_type_hints(cls)[f.name])
    if typing.get_type_hints(cls)[f.name] is not Any
]


def test_every_record_type_has_a_valid_minimal_form() -> None:
    for cls in RECORD_TYPES.values():
        assert isinstance(from_dict(_valid(cls)), cls)


@pytest.mark.parametrize(("cls", "name", "value"), CASES, ids=lambda x: repr(x)[:30])
def test_a_wrong_type_names_the_record_and_field(cls: type, name: str, value: Any) -> None:
    data = {**_valid(cls), name: value}
    with pytest.raises(RecordError, match=rf"bad {cls.TYPE} record: field '{name}'"):
        from_dict(data)


def test_ints_are_accepted_for_floats_and_converted() -> None:
    e = from_dict({"type": "step_completed", "time": 5, "attempt": 0, "rank": 0, "step": 1,
                   "duration_seconds": 2, "phases": {"data": 1}})
    assert isinstance(e, StepCompleted)
    assert type(e.time) is float and type(e.duration_seconds) is float and type(e.phases["data"]) is float


def test_free_form_fields_are_bounded() -> None:
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(RecordError, match=r"field 'config'.*deeper than 32"):
        from_dict({"type": "run_started", "time": 1, "run_id": "r", "config": {"a": deep}})
    with pytest.raises(RecordError, match=r"field 'params'.*out of range"):
        from_dict({"type": "fault_injected", "time": 1, "attempt": 0, "rank": 0, "step": 1, "kind": "x",
                   "params": {"n": 10**30}})
    ok = from_dict({"type": "run_started", "time": 1, "run_id": "r", "config": {"a": [1, "b", None, True, 2.5]}})
    assert ok.config == {"a": [1, "b", None, True, 2.5]}  # type: ignore[attr-defined]


STEP = '{"v":1,"type":"step_completed","time":100,"attempt":0,"rank":0,"step":1,"duration_seconds":1'


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (STEP.replace('"step":1', '"step":"1"') + "}", "field 'step': expected an integer, got a string"),
        (STEP.replace('"attempt":0', '"attempt":[0]') + "}", "field 'attempt': expected an integer, got a list"),
        (STEP + ',"host":{"a":1}}', "field 'host': expected a string, got an object"),
        (STEP.replace('"rank":0', '"rank":true') + "}", "field 'rank': expected an integer, got true/false"),
        (STEP.replace('"time":100', '"time":NaN') + "}", "NaN is not a JSON number"),
        (STEP.replace('"time":100', '"time":-Infinity') + "}", "-Infinity is not a JSON number"),
        (STEP.replace('"time":100', '"time":1e999') + "}", "field 'time': number is not finite"),
        (STEP.replace('"step":1', '"step":' + "9" * 5000) + "}", "not valid JSON (Exceeds the limit"),
        (STEP.replace('"step":1', '"step":' + "9" * 30) + "}", "field 'step': integer out of range"),
        ('{"v":1,"type":"run_started","time":1,"run_id":"r","config":' + "[" * 100_000 + "]" * 100_000 + "}",
         "JSON nested too deeply"),
        ('{"v":true,"type":"run_started","time":1,"run_id":"r"}', "schema version"),
        ('{"v":1,"type":{"a":1},"time":1}', "record type must be a string, got an object"),
    ],
    ids=["str-step", "list-attempt", "dict-host", "bool-rank", "nan", "-inf", "overflow", "5000-digits",
         "beyond-64-bits", "deep", "bool-version", "dict-type"],
)
def test_reader_skips_bad_records_naming_file_line_and_field(tmp_path: Path, line: str, reason: str) -> None:
    path = tmp_path / "rank-0.jsonl"
    good = json.dumps({"v": 1, "type": "run_started", "time": 1, "run_id": "r"})
    path.write_text(f"{good}\n{line}\n{good}\n")
    skipped = SkippedRecords()
    assert len(read_events(path, skipped=skipped)) == 2
    (item,) = skipped.items
    assert item.line == 2 and item.path == str(path)
    assert reason in item.reason
