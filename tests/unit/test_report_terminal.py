"""The terminal report: every bucket shown, long interruption tables cut to the costliest rows."""

from __future__ import annotations

from trainguard.goodput import compute_goodput
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
