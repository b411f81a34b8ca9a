"""`trainguard.launch.output`: console lines in bounded memory and the size cap of rank logs."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.launch.log_rotation import collapse_front, rotate
from trainguard.launch.output import MAX_LINE_BYTES, ConsoleLines, LogPump, PumpedFile, set_append


def _feed(chunks: list[bytes], max_line: int = 8) -> list[bytes]:
    lines = ConsoleLines(max_line)
    out: list[bytes] = []
    for chunk in chunks:
        out += lines.feed(chunk)
        out += lines.pending_bar()
    return out + lines.close()


def test_lines_split_at_newlines_across_reads() -> None:
    assert _feed([b"ab\ncd", b"e\n", b"f"]) == [b"ab", b"cde", b"f"]
    assert _feed([b"a\r", b"\nb\r\n"]) == [b"a", b"b"]  # \r\n, even split across two reads


def test_an_over_long_line_comes_in_pieces() -> None:
    assert _feed([b"0123456789abcdefghij\n"]) == [b"01234567", b"89abcdef", b"ghij"]
    lines = ConsoleLines(MAX_LINE_BYTES)
    held = 0
    for _ in range(100):  # 6.4 MB without a newline: never more than one piece held
        out = lines.feed(b"x" * 65536)
        assert all(len(p) == MAX_LINE_BYTES for p in out)
        held = max(held, len(lines._buf))
    assert held <= MAX_LINE_BYTES


def test_a_piece_never_splits_a_utf8_character() -> None:
    text = "é" * 20  # 2 bytes each
    pieces = _feed([text.encode() + b"\n"], max_line=7)
    assert all(p.decode() for p in pieces)
    assert b"".join(pieces).decode() == text


def test_a_progress_bar_shows_its_latest_state_once_per_pass() -> None:
    lines = ConsoleLines(64)
    assert lines.feed(b"\r 10%\r 20%\r 30%") == []
    assert lines.pending_bar() == [b" 20%"]  # " 30%" may still grow: it is not ended yet
    assert lines.pending_bar() == []
    assert lines.feed(b"\r100%\ndone\n") == [b"100%", b"done"]  # the final line supersedes " 30%"


def test_the_bar_then_its_final_line() -> None:
    out = _feed([b"\r 1%\r 2%\r 3%", b"\r100%\n"], max_line=64)
    assert out[-1] == b"100%"
    assert len(out) <= 3


def test_rotation_keeps_the_newest_part_and_one_rotated_file(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    writer = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)  # as torch opens it: no O_APPEND
    try:
        assert set_append([path]) == {path}
        console = io.StringIO()
        pump = LogPump([PumpedFile(path, console, "[rank0]: ")], max_bytes=1 << 20)
        for i in range(40):  # 40 x 100 KiB of lines
            os.write(writer, b"".join(b"line %06d-%04d\n" % (i, j) for j in range(6000)))
            pump.pass_once()
        os.write(writer, b"tail\n")
        pump.stop()
    finally:
        os.close(writer)
    rotated = tmp_path / "rank-0.log.1"
    assert pump.rotations >= 3
    assert path.stat().st_size < (1 << 20)  # the live part, written at its start again (no hole)
    assert 0 < rotated.stat().st_size <= (1 << 20) + 200 * 1024
    assert b"\0" not in path.read_bytes()
    assert path.read_bytes().endswith(b"tail\n")
    assert console.getvalue().endswith("[rank0]: tail\n")


def test_rotate_replaces_the_previous_rotated_file(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(b"first\n")
    rotate(path)
    path.write_bytes(b"second\n")
    rotate(path)
    assert (tmp_path / "x.log.1").read_bytes() == b"second\n" and path.read_bytes() == b""
    assert not (tmp_path / "x.log.1.tmp").exists()


def test_the_evidence_tail_of_a_just_rotated_log_continues_in_its_rotated_file(tmp_path: Path) -> None:
    from trainguard.launch.evidence import log_tail

    path = tmp_path / "rank-1.log"
    path.write_bytes(b"".join(b"old %d\n" % i for i in range(100)))
    rotate(path)
    path.write_bytes(b"new 0\nTraceback: boom\n")
    tail = log_tail(path, 5).splitlines()
    assert tail == ["old 97", "old 98", "old 99", "new 0", "Traceback: boom"]
    assert log_tail(tmp_path / "missing.log", 5) == ""


def test_rotation_loses_no_line_a_writer_appends_meanwhile(tmp_path: Path) -> None:
    # The break: the log was copied, then truncated; a line written between the last copied byte and the
    # truncation was in neither file (a flooding rank's last line "done" was lost that way in a CI run).
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * 3 * 4096)
    with open(probe, "r+b") as fh:
        if not collapse_front(fh.fileno(), 4096):
            pytest.skip("this filesystem cannot remove a file's front: rotation copies and truncates (documented loss)")
    path = tmp_path / "rank-0.stdout.log"
    path.write_bytes(b"")
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", (
        "import os, sys\n"
        f"fd = os.open({str(path)!r}, os.O_WRONLY | os.O_APPEND)\n"
        f"stop, i = {str(stop)!r}, 0\n"
        "while not (i % 1000 == 0 and os.path.exists(stop)):\n"
        "    os.write(fd, b'%d\\n' % i); i += 1\n")])
    moved = bytearray()
    try:
        rotations = 0
        while rotations < 150:
            if path.stat().st_size > 12 * 1024:
                rotate(path)
                moved += (tmp_path / "rank-0.stdout.log.1").read_bytes()
                rotations += 1
            assert writer.poll() is None
    finally:
        stop.touch()
        writer.wait(timeout=60)
    lines = (bytes(moved) + path.read_bytes()).splitlines()
    assert len(lines) > 150 * 1000
    assert [int(x) for x in lines] == list(range(len(lines)))
