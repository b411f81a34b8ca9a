"""Event files under stress: a full disk mid-record, a torn tail from a killed writer, the file mode,
and readers that meet a FIFO, a symbolic link out of the run, or a line of many megabytes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import tracemalloc
from pathlib import Path

import pytest

from trainguard.core.eventlog import (
    EVENT_FILE_MODE,
    MAX_RECORD_BYTES,
    EventWriter,
    SkippedRecords,
    iter_events,
    read_events,
    read_run,
)
from trainguard.core.events import StepCompleted

_FULL_DISK_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys
    from trainguard.errors import StorageError
    from trainguard.core.eventlog import EventWriter
    from trainguard.core.events import StepCompleted

    # Without this the kernel kills the process at the limit instead of failing the write.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    path, limit = sys.argv[1], int(sys.argv[2])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    w = EventWriter(path)

    def record(step):
        return StepCompleted(time=1000.0 + step, host="h", attempt=0, rank=0, step=step, duration_seconds=1.0)

    ok, failed = [], []
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))  # the "disk" fills at `limit` bytes
    for step in range(1, 40):
        try:
            w.write(record(step))
            ok.append(step)
        except StorageError as exc:
            failed.append(str(exc))
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space is freed
    for step in range(100, 103):
        w.write(record(step))
        ok.append(step)
    w.close()
    print(ok)
    print(failed[0])
    """
)


def test_a_full_disk_never_leaves_a_torn_record_before_a_good_one(tmp_path: Path) -> None:
    pytest.importorskip("resource")
    path = tmp_path / "rank-0.jsonl"
    limit = 1000  # bytes: a handful of records, the last of them cut off mid-record
    p = subprocess.run([sys.executable, "-c", _FULL_DISK_SCRIPT, str(path), str(limit)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    ok_line, first_failure = p.stdout.splitlines()[:2]
    ok = json.loads(ok_line)
    assert "short write" in first_failure  # the limit really did cut a record in two
    skipped = SkippedRecords()
    steps = [e.step for e in read_events(path, skipped=skipped) if isinstance(e, StepCompleted)]
    assert steps == ok and steps[-3:] == [100, 101, 102]
    assert skipped.total == 0  # the partial record was removed, not merely fenced off
    assert path.read_bytes().endswith(b"\n")


def test_a_new_writer_does_not_glue_its_record_onto_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "agent.jsonl"
    with EventWriter(path) as w:
        w.write(StepCompleted(time=1.0, attempt=0, rank=0, step=1, duration_seconds=1.0))
    with path.open("ab") as fh:
        fh.write(b'{"v":1,"type":"step_comp')  # the previous writer was killed mid-record
    with EventWriter(path) as w:  # e.g. the agent restarted
        w.write(StepCompleted(time=2.0, attempt=0, rank=0, step=2, duration_seconds=1.0))
    skipped = SkippedRecords()
    assert [e.step for e in read_events(path, skipped=skipped)] == [1, 2]  # type: ignore[attr-defined]
    assert [(s.line, s.reason) for s in skipped.items] == [(2, "not valid JSON")]


@pytest.mark.parametrize("umask", [0o000, 0o077, 0o022])
def test_event_files_are_created_0640_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "rank-0.jsonl"
    old = os.umask(umask)
    try:
        EventWriter(path).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == EVENT_FILE_MODE == 0o640


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    path.write_bytes(b"")
    path.chmod(0o600)
    EventWriter(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def _within(seconds: float, fn):  # type: ignore[no-untyped-def]
    """Run ``fn`` in a daemon thread; fail (instead of hanging the suite) if it blocks."""
    out: list[object] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the reader blocked"
    if errors:
        raise errors[0]
    return out[0]


def _good_run(root: Path) -> None:
    with EventWriter(root / "events" / "rank-0.jsonl") as w:
        w.write(StepCompleted(time=1.0, attempt=0, rank=0, step=1, duration_seconds=1.0))


def test_a_fifo_is_skipped_not_waited_on(tmp_path: Path) -> None:
    _good_run(tmp_path / "run")
    os.mkfifo(tmp_path / "run" / "events" / "x.jsonl")
    skipped = SkippedRecords()
    got = _within(10, lambda: read_run(tmp_path / "run", skipped=skipped))
    assert [(w, n) for w, n, _ in got] == [("rank-0", 1)]
    assert skipped.items[0].path.endswith("x.jsonl") and "FIFO" in skipped.items[0].reason


def test_a_directory_named_like_an_event_file_is_skipped(tmp_path: Path) -> None:
    _good_run(tmp_path / "run")
    (tmp_path / "run" / "events" / "d.jsonl").mkdir()
    skipped = SkippedRecords()
    assert len(read_run(tmp_path / "run", skipped=skipped)) == 1
    assert "directory" in skipped.items[0].reason


def test_symlinks_are_followed_only_inside_the_run(tmp_path: Path) -> None:
    _good_run(tmp_path / "run")
    outside = tmp_path / "secret.jsonl"
    inside = tmp_path / "run" / "archive" / "rank-1.jsonl"
    for target, step in ((outside, 7), (inside, 8)):
        with EventWriter(target) as w:
            w.write(StepCompleted(time=1.0, attempt=0, rank=1, step=step, duration_seconds=1.0))
    (tmp_path / "run" / "events" / "out.jsonl").symlink_to(outside)
    (tmp_path / "run" / "events" / "in.jsonl").symlink_to(inside)
    skipped = SkippedRecords()
    got = read_run(tmp_path / "run", skipped=skipped)
    assert sorted((w, e.step) for w, _, e in got) == [("in", 8), ("rank-0", 1)]  # type: ignore[attr-defined]
    assert "outside" in skipped.items[0].reason and skipped.items[0].path.endswith("out.jsonl")


def test_an_overlong_line_is_skipped_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    good = b'{"v":1,"type":"run_started","time":1,"run_id":"r"}\n'
    huge = 24 * MAX_RECORD_BYTES
    with path.open("wb") as fh:
        fh.write(good)
        fh.write(b'{"v":1,"type":"run_started","time":1,"run_id":"' + b"x" * huge + b'"}\n')
        fh.write(good)
    skipped = SkippedRecords()
    tracemalloc.start()
    try:
        got = read_events(path, skipped=skipped)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got) == 2
    assert [(s.line, s.reason) for s in skipped.items] == [(2, f"record longer than {MAX_RECORD_BYTES} bytes")]
    assert peak < 4 * MAX_RECORD_BYTES, peak  # a few chunks, never the 24 MiB line


def test_a_line_just_under_the_cap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    head = b'{"v":1,"type":"run_started","time":1,"run_id":"'
    pad = MAX_RECORD_BYTES - len(head) - 2
    path.write_bytes(head + b"x" * pad + b'"}\n')
    (record,) = read_events(path)
    assert len(record.run_id) == pad  # type: ignore[attr-defined]


def test_strict_reading_refuses_an_unusable_file(tmp_path: Path) -> None:
    from trainguard.errors import InputError

    os.mkfifo(tmp_path / "x.jsonl")
    with pytest.raises(InputError, match="FIFO"):
        _within(10, lambda: list(iter_events(tmp_path / "x.jsonl", strict=True)))
