"""The console lines of `trainguard run` for single records: what a person reads during a failure."""

from __future__ import annotations

import io
import signal
from pathlib import Path
from types import SimpleNamespace

from trainguard.cli.console import Console
from trainguard.events import Diagnosis
from trainguard.launch import blame
from trainguard.protocol import RunLayout


def _console(tmp_path: Path) -> Console:
    cfg = SimpleNamespace(layout=RunLayout(tmp_path), node_id="n0")
    return Console(cfg, stream=io.StringIO())


def test_an_unknown_category_says_what_was_seen(tmp_path: Path) -> None:
    codes = {1: -signal.SIGKILL}
    explanation = blame.crash_detail(codes) + blame.unexplained_crash_note(codes, [1])
    line = _console(tmp_path).describe(Diagnosis(time=1.0, host="n0", attempt=0, category="Unknown",
                                                 verdict="crash", culprit_ranks=(1,), explanation=explanation))
    assert line is not None
    assert "category Unknown (confidence 0.00) (rank 1 killed by SIGKILL; rank 1 died of SIGKILL" in line
    assert line.endswith(f"evidence in {tmp_path / 'diagnostics' / 'attempt-0'}")


def test_a_known_category_keeps_the_line_short(tmp_path: Path) -> None:
    line = _console(tmp_path).describe(Diagnosis(time=1.0, host="n0", attempt=2, category="GPU HBM3 Memory",
                                                 culprit_ranks=(0,), confidence=0.9,
                                                 explanation="Xid 48 in the log of rank 0"))
    assert line is not None and "Xid 48" not in line and "category GPU HBM3 Memory (confidence 0.90);" in line
