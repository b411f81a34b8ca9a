"""Streaming a run with its step records folded (`trainguard.accounting.stepfold`): same figures, bounded memory."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from trainguard.accounting.goodput import compute_goodput
from trainguard.accounting.stepfold import FOLDED_WRITER, FoldedSteps, StepFolder, fold_run
from trainguard.core.eventlog import EventWriter
from trainguard.core.events import AttemptEnded, AttemptStarted, RunEnded, RunStarted, StepCompleted
from trainguard.core.protocol import RunLayout
from trainguard.core.rundir import LoadedEvent, RunDir
from trainguard.samples import SAMPLE_RUN

FIGURES = ("ettr", "wall_seconds", "productive_seconds")


def _close(a: object, b: object) -> bool:
    """Equal, floats up to a millisecond or one part in 10**6: inside a folded window the few microseconds between
    one step's end and the next one's start count with the steps."""
    if isinstance(a, float) and isinstance(b, float):
        return b == pytest.approx(a, rel=1e-6, abs=1e-3)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_below_the_cap_nothing_is_folded_and_the_report_is_the_same() -> None:
    whole = compute_goodput(RunDir(SAMPLE_RUN).load()).to_json()
    streamed = fold_run(SAMPLE_RUN)
    assert streamed.folded_records == 0
    report = compute_goodput(streamed).to_json()
    assert {k: v for k, v in report.items() if k != "run_id"} == {k: v for k, v in whole.items() if k != "run_id"}


def test_folded_sample_run_agrees_with_the_whole_records() -> None:
    whole = compute_goodput(RunDir(SAMPLE_RUN).load()).to_json()
    streamed = fold_run(SAMPLE_RUN, kept=2000)
    assert streamed.folded_records > 4000 and streamed.spans < streamed.folded_records // 4
    assert any(item.writer == FOLDED_WRITER for item in streamed.items)
    report = compute_goodput(streamed).to_json()
    for key in (*FIGURES, "badput_seconds", "attempts", "completed_steps", "interruptions", "root_causes",
                "clock_offsets_seconds", "resume_points", "status", "excluded_records_total"):
        assert _close(whole[key], report[key]), key
    assert any("folded" in w for w in report["warnings"])


def test_a_corrupt_step_record_is_still_named_when_its_neighbours_are_folded(tmp_path: Path) -> None:
    root = tmp_path / "sample-run"
    (root / "events").mkdir(parents=True)
    for path in Path(SAMPLE_RUN, "events").iterdir():
        (root / "events" / path.name).write_bytes(path.read_bytes())
    rank = root / "events" / "rank-1.jsonl"
    lines = rank.read_bytes().splitlines(keepends=True)
    bad = json.loads(lines[-10])
    assert bad["type"] == "step_completed"
    bad["duration_seconds"] = -5.0
    lines[-10] = (json.dumps(bad) + "\n").encode()
    rank.write_bytes(b"".join(lines))
    report = compute_goodput(root, step_records_kept=2000)
    assert report.excluded_records_total == 1
    assert (report.excluded_records[0].writer, report.excluded_records[0].line) == ("rank-1", len(lines) - 9)
    assert "negative duration_seconds" in report.excluded_records[0].reason


def _long_run(root: Path, steps: int, ranks: int = 8) -> int:
    """One event file holding a whole run of ``steps`` steps of ``ranks`` ranks; returns its record count."""
    layout = RunLayout(root)
    layout.events_dir.mkdir(parents=True)
    t0 = 1_700_000_000.0
    with EventWriter(layout.event_file("all")) as w:
        w.write(RunStarted(time=t0, host="node0", run_id="long", world_size=ranks, nnodes=1, target_steps=steps,
                           config={}))
        w.write(AttemptStarted(time=t0 + 1, host="node0", attempt=0, world_size=ranks, hosts=("node0",),
                               resume_step=None, recovery=""))
        for s in range(1, steps + 1):
            for r in range(ranks):
                w.write(StepCompleted(time=t0 + 1 + s * 0.5, host="node0", attempt=0, rank=r, step=s,
                                      duration_seconds=0.5 - r * 1e-4,
                                      phases={"forward_backward": 0.4, "comm_wait": 0.1 - r * 1e-4}))
        w.write(AttemptEnded(time=t0 + 2 + steps * 0.5, host="node0", attempt=0, reason="completed", exit_code=0))
        w.write(RunEnded(time=t0 + 3 + steps * 0.5, host="node0", run_id="long", status="completed",
                         completed_steps=steps))
    return steps * ranks + 4


def _peak_bytes(root: Path, kept: int) -> tuple[int, float]:
    """Peak traced memory of reading and accounting the run, and its ETTR."""
    tracemalloc.start()
    try:
        report = compute_goodput(root, step_records_kept=kept)
        return tracemalloc.get_traced_memory()[1], report.ettr
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_number_of_records(tmp_path: Path) -> None:
    kept = 500
    small, large = tmp_path / "small", tmp_path / "large"
    _long_run(small, 500)
    records = _long_run(large, 2_000)
    assert records > 30 * kept
    compute_goodput(small, step_records_kept=kept)  # first use imports and caches: not the run's memory
    small_peak, small_ettr = _peak_bytes(small, kept)
    large_peak, large_ettr = _peak_bytes(large, kept)
    # Four times the records: the peak stays under a bound set by the cap (about 1 KiB per kept record, four
    # times over for the accounting's own tables), not by the run (unfolded, the large run needs about 10 MiB).
    bound = 4 * kept * 1024
    assert large_peak < bound, large_peak
    assert large_peak < 1.5 * small_peak, (small_peak, large_peak)
    assert small_ettr == pytest.approx(large_ettr, abs=0.01)
    assert large_ettr > 0.99


def test_whole_steps_are_spread_over_the_run_and_spans_stay_under_the_cap() -> None:
    kept, steps, ranks = 400, 6_000, 4
    folder = StepFolder(kept)
    for s in range(1, steps + 1):
        for r in range(ranks):
            record = StepCompleted(time=100.0 + s, host=f"h{r // 2}", attempt=0, rank=r, step=s, duration_seconds=1.0,
                                   numbering="attempt")
            folder.add(LoadedEvent(f"rank-{r}", s, record))
        if s % 500 == 0:
            assert len(folder.items) <= kept and len(folder.spans()) <= kept // 2
    whole = sorted({item.record.step for item in folder.items if isinstance(item.record, StepCompleted)})
    assert whole[0] == 1 and whole[-1] > steps // 2, whole  # not only the first steps
    spans = [item.record for item in folder.spans() if isinstance(item.record, FoldedSteps)]
    assert len(spans) == len(folder.spans())
    assert sum(span.records for span in spans) + len(whole) * ranks == steps * ranks
    assert {n for span in spans for n in span.numberings} == {"attempt"}
    # Every step is counted once: by its whole records or by the span of its host and window.
    covered = [s for span in spans if span.host == "h0" for s in range(span.first_step, span.last_step + 1)]
    assert sorted(covered + whole) == list(range(1, steps + 1))
