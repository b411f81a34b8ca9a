"""``trainguard stragglers RUN``: the ranks and hosts that held the job back, what each cost, and why (throttling)."""

from __future__ import annotations

import argparse
from typing import Any

from trainguard.errors import EXIT_OK, UsageError

HELP = "rank the slow ranks and hosts of a run and what each cost"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run directory (holds events/)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON (docs/stragglers.md)")
    parser.add_argument("--window-steps", type=int, default=8, metavar="N",
                        help="steps per detection window (default 8)")
    parser.add_argument("--min-slowdown", type=float, default=1.08, metavar="X",
                        help="smallest per-step slowdown a rank must cause to count as late (default 1.08)")


def build(run_dir: str, window_steps: int = 8, min_slowdown: float = 1.08) -> dict[str, Any]:
    """The ``--json`` document of a run (docs/stragglers.md)."""
    from trainguard.core.eventlog import SkippedRecords, read_run
    from trainguard.core.events import TelemetrySample
    from trainguard.core.rundir import RunDir
    from trainguard.stragglers import StragglerConfig, analyze, read_arrivals
    from trainguard.telemetry.power import power_report
    from trainguard.telemetry.thermal import SlowSpan, slow_spans, thermal_report, throttling

    try:
        config = StragglerConfig(window_steps=window_steps, min_slowdown=min_slowdown)
    except ValueError as exc:
        raise UsageError(f"--window-steps/--min-slowdown: {exc}") from None
    skipped = SkippedRecords()
    records = [r for _, _, r in read_run(run_dir, skipped=skipped)]
    warnings: list[str] = []
    if skipped.total:
        warnings.append(f"{skipped.total} unreadable record(s) skipped (first: {skipped.items[0]})")
    arrivals = read_arrivals(run_dir, warnings)
    report = analyze(records, arrivals, config)
    doc: dict[str, Any] = {"run_id": RunDir(run_dir).run_id, **report.to_json()}
    samples = [e for e in records if isinstance(e, TelemetrySample)]
    for entry, s in zip(doc["stragglers"], report.stragglers, strict=True):
        times = [x[2] for x in s.saved_by_step]
        finding = throttling(samples, s.host, min(times) - 60, max(times) + 60) if times and samples else None
        entry["throttling"] = finding.to_json() if finding else None
        entry["cause"] = finding.cause if finding and finding.throttled \
            else "unknown (no throttling seen)" if finding else "unknown (no telemetry)"
    spans: dict[str, SlowSpan] = {span.host: span for span in slow_spans(report.stragglers)}
    for h in doc["hosts"]:
        span = spans.get(h["host"])
        finding = throttling(samples, h["host"], span.start - 60, span.end + 60) if span and samples else None
        h["throttling"] = finding.to_json() if finding else None
    telemetry = thermal_report(records, list(spans.values())).to_json()
    telemetry["power"] = power_report(records).to_json()
    doc["telemetry"] = telemetry
    doc["warnings"] = warnings
    return doc


def render(doc: dict[str, Any]) -> str:
    lines = [f"stragglers of {doc['run_id']}: {doc['steps_analysed']} steps of {doc['ranks']} ranks analysed, "
             f"median step {doc['step_time_seconds'] * 1e3:.1f} ms"]
    if not doc["stragglers"]:
        lines.append("no straggler found")
    for s in doc["stragglers"]:
        lines.append(f"  rank {s['rank']} on {s['host'] or '?'}: {s['slowdown']:.2f}x slower steps from step "
                     f"{s['onset_step']} (named at step {s['detected_step']}, {s['signal']}); cost "
                     f"{s['cost_seconds']:.1f} s; step {s['step_seconds'] * 1e3:.1f} ms -> "
                     f"{s['step_seconds_without'] * 1e3:.1f} ms without it; cause: {s['cause']}")
    for h in doc["hosts"]:
        if h["whole_host"]:
            lines.append(f"  host {h['host']}: every rank slow ({', '.join(map(str, h['ranks']))}): a host problem")
    tel = doc["telemetry"]
    if tel.get("samples"):
        lines.append(f"telemetry: {tel['samples']} samples from {len(tel['hosts'])} host(s); throughput vs "
                     f"temperature r={_r(tel.get('throughput_vs_temperature'))}, vs clock "
                     f"r={_r(tel.get('throughput_vs_clock'))}")
        for sw in tel["power"]["largest_swings"]:
            lines.append(f"  power swing {sw['delta_watts']:+.0f} W ({sw['cause']}: {sw['detail']})")
    lines += [f"note: {n}" for n in doc["notes"]]
    lines += [f"warning: {w}" for w in doc["warnings"]]
    return "\n".join(lines)


def _r(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.output import print_json, print_text

    doc = build(args.run_dir, args.window_steps, args.min_slowdown)
    if args.json:
        print_json(doc)
    else:
        print_text(render(doc))
    return EXIT_OK
