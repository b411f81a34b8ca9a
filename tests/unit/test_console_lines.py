"""The console lines of `trainguard run` for single records: what a person reads during a failure."""

from __future__ import annotations

import io
import signal
from pathlib import Path
from types import SimpleNamespace

from trainguard.cli.console import Console
from trainguard.core.events import AttemptStarted, Diagnosis, InProcessRecovery
from trainguard.core.protocol import RunLayout
from trainguard.launch import blame


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


def test_in_process_restarts_are_named_as_such(tmp_path: Path) -> None:
    console = _console(tmp_path)
    started = console.describe(AttemptStarted(time=1.0, host="n0", attempt=1, world_size=2, recovery="in-process",
                                              resume_step=4))
    assert started == "in-process restart: attempt 1 with 2 ranks, resuming from the checkpoint of step 4"
    plain = console.describe(AttemptStarted(time=1.0, host="n0", attempt=2, world_size=2, recovery="restart"))
    assert plain is not None and plain.startswith("restart: attempt 2 with 2 ranks, ")
    warm = console.describe(AttemptStarted(time=1.0, host="n0", attempt=2, world_size=2, recovery="restart",
                                           warm_starts=2))
    assert warm is not None and warm.startswith("restart: attempt 2 with 2 ranks (2 warm), ")
    ok = console.describe(InProcessRecovery(time=1.0, host="n0", attempt=1, status="recovered", ranks=(1,),
                                            seconds=0.31, warm_spares_used=1))
    assert ok == "in-process restart of attempt 1 recovered in 0.31s: rank 1 replaced (1 from warm spares)"
    gave_up = console.describe(InProcessRecovery(time=1.0, host="n0", attempt=1, status="fallback", ranks=(1,),
                                                 seconds=30.0, detail="group incomplete after 30 s"))
    assert gave_up == ("in-process restart of attempt 1 gave up after 30.00s: group incomplete after 30 s; "
                       "restarting every worker")


def test_a_known_category_says_its_cause_in_one_clause(tmp_path: Path) -> None:
    line = _console(tmp_path).describe(Diagnosis(time=1.0, host="n0", attempt=0, category="Dependency",
                                                 group="Dependency", verdict="crash", culprit_ranks=(1,),
                                                 confidence=0.9, cause="a Python package is missing: numpy"))
    assert line is not None and "\n" not in line
    assert "category Dependency (confidence 0.90: a Python package is missing: numpy);" in line
