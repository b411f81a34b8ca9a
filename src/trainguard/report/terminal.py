"""The goodput report as text for a terminal: ETTR, badput buckets, interruptions, root causes."""

from __future__ import annotations

from trainguard.accounting.goodput import BUCKETS, GoodputReport

_BUCKET_TITLES = {
    "startup": "job start-up and initialization",
    "checkpoint_save": "checkpoint save stalls",
    "checkpoint_restore": "checkpoint restore",
    "lost_progress": "progress lost (recomputed steps)",
    "detection": "failure detection delay",
    "restart": "restart / re-queue gap",
    "straggler": "straggler slowdown",
    "other": "other",
}


def format_seconds(seconds: float) -> str:
    """``3.2 s``, ``4 min 10 s``, ``2 h 05 min``, ``3 d 4 h``: readable at any scale."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
    return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"


def _bar(fraction: float, width: int = 24) -> str:
    filled = round(max(0.0, min(fraction, 1.0)) * width)
    return "█" * filled + "·" * (width - filled)


def _ranks(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "-"
    shown = ",".join(str(r) for r in ranks[:6])
    return shown + (f",…(+{len(ranks) - 6})" if len(ranks) > 6 else "")


def _culprit(ranks: tuple[int, ...], hosts: tuple[str, ...]) -> str:
    parts = ([f"rank {_ranks(ranks)}"] if ranks else []) + ([",".join(hosts[:2])] if hosts else [])
    return " @".join(parts) if parts else "-"


def render_report(report: GoodputReport, *, max_interruptions: int = 25) -> str:
    """The full text report; long interruption tables show the costliest ``max_interruptions``."""
    wall = report.wall_seconds or 1.0
    lines = [
        f"run {report.run_id or '?'}" + ("  [SYNTHETIC]" if report.synthetic else "") + f"  status: {report.status}",
        f"effective training time (ETTR): {report.ettr:.1%}   "
        f"wall {format_seconds(report.wall_seconds)}, productive {format_seconds(report.productive_seconds)}",
        f"steps completed: {report.completed_steps}"
        + (f" of {report.target_steps}" if report.target_steps else "")
        + f"   attempts: {report.attempts}   interruptions: {len(report.interruptions)}",
        "",
        "where the time went",
        f"  {'productive training':<36} {format_seconds(report.productive_seconds):>12} "
        f"{report.productive_seconds / wall:7.2%}  {_bar(report.productive_seconds / wall)}",
    ]
    for bucket in BUCKETS:
        secs = report.badput_seconds.get(bucket, 0.0)
        lines.append(
            f"  {_BUCKET_TITLES[bucket]:<36} {format_seconds(secs):>12} {secs / wall:7.2%}  {_bar(secs / wall)}"
        )
    if report.interruptions:
        # lost steps and the seconds they took, then the whole cost (with detection, restart and start-up)
        lines += ["", "interruptions", f"  {'at':>11}  {'kind':<10} {'step':>6}  {'detect':>8}  "
                  f"{'category':<28} {'culprit':<18} {'lost steps':>10} {'lost progress':>13} {'whole cost':>10}"]
        shown = report.interruptions
        if len(shown) > max_interruptions:
            costly = sorted(shown, key=lambda i: -i.time_lost_seconds)[:max_interruptions]
            shown = sorted(costly, key=lambda i: i.time_seconds)
        for i in shown:
            culprit = "-" if i.planned else _culprit(i.culprit_ranks or i.ranks, i.culprit_hosts or i.hosts)
            lines.append(
                f"  {format_seconds(i.time_seconds):>11}  {i.kind:<10} {'-' if i.step is None else i.step:>6}  "
                f"{i.detection_latency_seconds:7.1f}s  {i.category[:28]:<28} "
                f"{culprit[:18]:<18} {'?' if i.lost_steps is None else i.lost_steps:>10} "
                f"{format_seconds(i.lost_progress_seconds):>13} {format_seconds(i.time_lost_seconds):>10}"
            )
        if len(shown) < len(report.interruptions):
            lines.append(f"  ... {len(report.interruptions) - len(shown)} more, cheaper ones (all of them: --json)")
    if report.root_causes:
        lines += ["", "root causes (Llama 3 Table 5 form)",
                  f"  {'category':<32} {'group':<22} {'count':>5} {'share':>7} {'time lost':>12}"]
        for row in report.root_causes:
            lines.append(
                f"  {row['category'][:32]:<32} {row['group'][:22]:<22} {row['count']:>5} "
                f"{row['share']:7.1%} {format_seconds(row['time_lost_seconds']):>12}"
            )
    rates = [r for _, r in report.steps_per_second]
    if rates and max(rates) > 0:
        blocks = " ▁▂▃▄▅▆▇█"
        top = max(rates)
        spark = "".join(blocks[min(8, round(r / top * 8))] for r in rates)
        lines += ["", f"steps/s over time (peak {top:.3g}/s)", f"  {spark}"]
    for w in report.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)
