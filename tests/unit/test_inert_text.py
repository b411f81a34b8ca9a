"""Escape sequences in logs and events never reach the terminal: the sanitizer, and the verbs that print run data.

OSC 52 (``ESC ] 52 ; c ; <base64> BEL``) writes the reader's clipboard, OSC 8 hides a link under text, CSI
``2J`` clears the screen; a terminal acts on them when a verb prints a log line or a host name as it is.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainguard.cli.console import Console
from trainguard.core import events as ev
from trainguard.core.rundir import RunDir
from trainguard.report.inert import for_terminal

CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07"
LINK = "\x1b]8;;http://x\x1b\\click\x1b]8;;\x1b\\"
CLEAR = "\x1b[2J\x1b[H"
HOSTILE = f"{CLIPBOARD}title{LINK}{CLEAR}end"
CONTROLS = [chr(c) for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))]


def _acts_on_a_terminal(text: str) -> list[str]:
    """The characters of ``text`` a terminal would interpret (anything but tab and newline below 0x20, DEL, C1)."""
    return [c for c in text if c in CONTROLS or "\u202a" <= c <= "\u202e" or "\u2066" <= c <= "\u2069"]


@pytest.mark.parametrize(("raw", "shown"), [
    (CLIPBOARD + "after", "after"),  # OSC 52 with its payload: no clipboard write, no base64 left over
    ("\x1b]0;owned\x07prompt", "prompt"),  # OSC 0 (window title)
    ("\x1b]0;owned\x1b\\prompt", "prompt"),  # ... ended by ST instead of BEL
    (LINK, "click"),  # OSC 8: the link target goes, the text stays
    ("a\x1b[2Jb\x1b[31mred\x1b[0m", "abred"),  # CSI: screen clear, colours
    ("\x9b2J\x9d0;t\x9cok", "ok"),  # the same as 8-bit C1 controls
    ("\x1bcreset", "reset"),  # ESC c (full reset)
    ("\x1b(0box", "box"),  # a character-set switch
    ("cut\x1b]52;c;AAAA\nnext line", "cut\nnext line"),  # unterminated: ends at the line, not at the text end
    ("line\rfake", "line\\x0dfake"),  # a carriage return would overwrite the line: shown, not obeyed
    ("bell\x07 nul\x00 del\x7f", "bell\\x07 nul\\x00 del\\x7f"),
    ("abc\u202edcba", "abc\\u202edcba"),  # bidirectional override ("Trojan Source")
    ("tab\tand\nnewline", "tab\tand\nnewline"),
    ("plain text, █ bars and ünïcode", "plain text, █ bars and ünïcode"),
])
def test_for_terminal(raw: str, shown: str) -> None:
    assert for_terminal(raw) == shown
    assert for_terminal(shown) == shown  # idempotent


def test_for_terminal_leaves_nothing_a_terminal_acts_on() -> None:
    every = "".join(CONTROLS) + "".join(f"\x1b{c}" for c in map(chr, range(0x20, 0x7F))) + HOSTILE
    assert _acts_on_a_terminal(for_terminal(every)) == []


@pytest.fixture
def hostile_run(tmp_path: Path) -> Path:
    rd = RunDir(tmp_path / "run").create()
    with rd.writer("agent-x") as w:
        w.write_all([
            ev.RunStarted(time=0.0, host="x", run_id=f"job{CLEAR}", world_size=1),
            ev.AttemptStarted(time=0.0, host="x", attempt=0, world_size=1),
            ev.StepCompleted(time=2.0, host="x", attempt=0, rank=0, step=1, duration_seconds=1.0),
            ev.FailureDetected(time=3.0, host="x", attempt=0, kind=f"crash{CLIPBOARD}", ranks=(0,),
                               hosts=(f"node{LINK}",), detail=HOSTILE),
            ev.Diagnosis(time=3.0, host="x", attempt=0, category=f"Faulty GPU{CLEAR}", explanation=HOSTILE,
                         culprit_ranks=(0,), culprit_hosts=(f"node{LINK}",), confidence=1.0),
            ev.RunEnded(time=4.0, host="x", run_id="job", status="failed"),
        ])
    return rd.root


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, "COLUMNS": "200"})


def test_report_prints_no_escape_sequence_from_events(hostile_run: Path) -> None:
    res = _cli("report", str(hostile_run))
    assert res.returncode == 0, res.stderr
    assert _acts_on_a_terminal(res.stdout + res.stderr) == [], repr(res.stdout)
    assert "crash" in res.stdout and "Faulty GPU" in res.stdout and "job" in res.stdout
    assert "Y3VybCBldmlsIHwgc2g=" not in res.stdout  # the clipboard payload is gone, not just its ESC


def test_classify_prints_no_escape_sequence_from_a_log(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text(f"step 1\nNVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.{CLIPBOARD}"
                   f"{LINK}{CLEAR}\nRuntimeError: CUDA error: unspecified launch failure {HOSTILE}\n")
    res = _cli("classify", str(log))
    assert res.returncode == 0, res.stderr
    assert "Xid" in res.stdout and "fallen off the bus" in res.stdout  # the evidence line is still shown
    assert _acts_on_a_terminal(res.stdout + res.stderr) == [], repr(res.stdout)


def test_console_lines_carry_no_escape_sequence(tmp_path: Path) -> None:
    layout = SimpleNamespace(agent_events=lambda node: tmp_path / "events" / f"agent-{node}.jsonl",
                             diagnostics_dir=lambda attempt: tmp_path / "diagnostics" / f"attempt-{attempt}")
    out = io.StringIO()
    console = Console(SimpleNamespace(layout=layout, node_id="n0", run_dir=tmp_path), stream=out)
    for record in (ev.FailureDetected(time=1.0, host="x", attempt=0, kind=f"hang{CLEAR}", ranks=(1,),
                                      hosts=(f"node{LINK}",), detail=HOSTILE, step=3),
                   ev.NodeExcluded(time=2.0, host="x", attempt=0, node=f"n1{CLIPBOARD}", reason=HOSTILE)):
        text = console.describe(record)
        assert text is not None
        console.line(text)
    printed = out.getvalue()
    assert printed.count("\n") == 2 and "hang" in printed and "excluded" in printed
    assert _acts_on_a_terminal(printed) == [], repr(printed)


def test_errors_and_log_lines_are_inert(tmp_path: Path) -> None:
    """What a verb says on stderr about bad input quotes the input: that too goes through the sanitizer."""
    missing = tmp_path / f"no{CLEAR}such{CLIPBOARD}"
    res = _cli("report", str(missing))
    assert res.returncode == 3
    assert "no" in res.stderr and _acts_on_a_terminal(res.stderr) == [], repr(res.stderr)
