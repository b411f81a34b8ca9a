"""`EventFollower`: the live reader behind the console and demo lines."""

from __future__ import annotations

import json
from pathlib import Path

from trainguard.core.eventlog import MAX_RECORD_BYTES, EventFollower, EventWriter
from trainguard.core.events import AttemptEnded, AttemptStarted


def test_follows_appends_skips_bad_records_and_waits_for_partial_lines(tmp_path: Path) -> None:
    path = tmp_path / "events" / "agent-n.jsonl"
    follower = EventFollower(path)
    assert follower.new_records() == []  # the file need not exist yet
    writer = EventWriter(path)
    writer.write(AttemptStarted(time=1.0, host="n", attempt=0, world_size=2, hosts=("n",), resume_step=None))
    assert [type(r) for r in follower.new_records()] == [AttemptStarted]
    assert follower.new_records() == []
    ended = json.dumps({"v": 1, "type": "attempt_ended", "time": 2.0, "host": "n", "attempt": 0,
                        "reason": "failure", "exit_code": None}).encode()
    with path.open("ab") as fh:
        fh.write(b'{"v": 1, "type": "attempt_ended", "attempt": "zero"}\n')  # wrong type: skipped
        fh.write(ended[:20])  # a record still being written
    assert follower.new_records() == []
    with path.open("ab") as fh:
        fh.write(ended[20:] + b"\n")
    records = follower.new_records()
    assert len(records) == 1 and isinstance(records[0], AttemptEnded) and records[0].attempt == 0


def test_a_line_longer_than_any_record_is_dropped_not_stuck_on(tmp_path: Path) -> None:
    path = tmp_path / "agent-n.jsonl"
    path.write_bytes(b"x" * (5 * MAX_RECORD_BYTES) + b"\n")
    follower = EventFollower(path)
    for _ in range(3):
        follower.new_records()
    EventWriter(path).write(AttemptEnded(time=2.0, host="n", attempt=3, reason="failure", exit_code=1))
    records = follower.new_records() + follower.new_records()
    assert [r.attempt for r in records if isinstance(r, AttemptEnded)] == [3]
