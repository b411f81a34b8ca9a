"""``trainguard report RUN``: effective training time and every badput bucket of a run."""

from __future__ import annotations

import argparse
import sys

from trainguard.errors import EXIT_OK

HELP = "effective training time (ETTR) and every kind of lost time of a run"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run directory (holds events/)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (docs/goodput.md)")
    parser.add_argument("--html", metavar="FILE",
                        help="write the report with its plots as one self-contained HTML file instead of printing it "
                             "(docs/dashboard.md); with --json the JSON is printed too")


def run(args: argparse.Namespace) -> int:
    from trainguard.accounting.goodput import compute_goodput
    from trainguard.accounting.stepfold import fold_run
    from trainguard.cli.output import print_json, print_text
    from trainguard.report.drains import drain_section, render_drains
    from trainguard.report.terminal import render_report
    from trainguard.report.thermal_power import render_text, run_sections

    if args.html:
        from trainguard.web.render import require

        require("jinja2", "plotly", what="report --html")  # before any work: a missing extra is a usage error
    run = fold_run(args.run_dir)  # one pass over the events, bounded memory (docs/goodput.md "Long runs")
    report = compute_goodput(run)
    if args.html:
        from trainguard.report.html import write_html

        written = write_html(args.run_dir, args.html, report)
        print_text(f"trainguard report: HTML report written to {written}", file=sys.stderr)
        if not args.json:  # the file is what was asked for: the terminal report is not printed beside it
            return EXIT_OK
    extra = run_sections(run)
    drains = drain_section(run)  # the nodes the run drained in the scheduler (docs/operations.md)
    if args.json:
        print_json({**report.to_json(), **extra, **drains})
    else:
        print_text("\n".join([render_report(report), *render_text(extra), *render_drains(drains)]))
    return EXIT_OK
