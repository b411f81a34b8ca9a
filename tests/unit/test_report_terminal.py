"""The terminal report: every bucket shown, long interruption tables cut to the costliest rows."""

from __future__ import annotations

import shutil
from pathlib import Path

from trainguard.accounting.goodput import compute_goodput
from trainguard.report.terminal import format_seconds, render_report
from trainguard.samples import SAMPLE_RUN


def test_all_buckets_and_interruptions_are_shown() -> None:
    text = render_report(compute_goodput(SAMPLE_RUN))
    for title in ("checkpoint save stalls", "checkpoint restore", "progress lost", "failure detection delay",
                  "job start-up", "restart / re-queue gap", "other"):
        assert title in text
    assert "rank 5 @node-b" in text and "GPU HBM3 Memory" in text


def test_long_tables_keep_the_costliest_rows() -> None:
    report = compute_goodput(SAMPLE_RUN)
    text = render_report(report, max_interruptions=1)
    costliest = max(report.interruptions, key=lambda i: i.time_lost_seconds)
    assert costliest.category in text.split("root causes")[0]
    assert "2 more, cheaper ones" in text


def test_format_seconds_scales() -> None:
    assert format_seconds(3.25) == "3.2 s"
    assert format_seconds(250) == "4 min 10 s"
    assert format_seconds(7500) == "2 h 05 min"
    assert format_seconds(3 * 86400 + 4 * 3600) == "3 d 4 h"


def test_skipped_and_excluded_records_get_one_warning_line_each(tmp_path: Path) -> None:
    root = tmp_path / "run"
    shutil.copytree(SAMPLE_RUN, root)
    path = root / "events" / "rank-1.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[9] = b"garbage\n"
    lines[19] = lines[19].replace(b'"attempt":0', b'"attempt":99')
    lines[29] = lines[29].replace(b'"attempt":0', b'"attempt":99')
    path.write_bytes(b"".join(lines))
    text = render_report(compute_goodput(root))
    warnings = [line for line in text.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert "1 unreadable record(s) skipped" in warnings[0] and "rank-1.jsonl:10: not valid JSON" in warnings[0]
    assert warnings[1].startswith("warning: 2 implausible record(s) excluded from the accounting (first: rank-1:20")
