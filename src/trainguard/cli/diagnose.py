"""``trainguard diagnose``: which rank and host hung or diverged, from flight-recorder dumps (from the ranks' text
logs where there are none)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from trainguard.errors import EXIT_FAILURE, EXIT_OK, InputError, UsageError

if TYPE_CHECKING:
    from trainguard.localize.diagnose import NoDumpsError

HELP = "localize a hang or desync from flight-recorder dumps (which rank, which host, what)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH",
                        help="directory of dumps (rank = trailing number of the file name), one dump, "
                             "a run directory or its diagnostics/attempt-<k>/; without dumps, the ranks' text "
                             "logs there")
    parser.add_argument("--json", action="store_true", help="print one JSON document (schema: docs/localize.md)")
    parser.add_argument("--rank-map", metavar="FILE",
                        help='JSON file {"<rank>": "<host>"} (default: from the run\'s events, if any)')
    parser.add_argument("--world-size", type=int, default=0, metavar="N",
                        help="ranks in the job, so a missing dump of the last ranks is noticed")
    parser.add_argument("--verbose-evidence", action="store_true", help="more frames and evidence lines")


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.output import Progress, print_json, print_text
    from trainguard.localize import diagnose_path, load_rank_map, render_text
    from trainguard.localize.diagnose import NoDumpsError
    from trainguard.localize.reader import MAX_RANK

    if args.world_size < 0 or args.world_size > MAX_RANK + 1:
        raise UsageError(f"--world-size must be between 0 and {MAX_RANK + 1}, not {args.world_size}")
    hosts = load_rank_map(args.rank_map) if args.rank_map else None
    bars: list[Progress] = []

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(Progress(total, "reading dumps"))
        bars[0].update()

    try:
        report = diagnose_path(args.path, hosts, world_size=args.world_size, progress=progress)
    except NoDumpsError as exc:
        return _from_text_logs(args, exc)
    finally:
        for bar in bars:
            bar.close()
    if args.json:
        print_json(report.to_json())
    else:
        print_text(render_text(report, verbose=args.verbose_evidence))
    # "incomplete" (a rank could not be read) and "insufficient-evidence" (the dumps lack records that
    # could show a problem) are never success: health was not established
    return EXIT_OK if report.verdict == "healthy" else EXIT_FAILURE


def _from_text_logs(args: argparse.Namespace, no_dumps: NoDumpsError) -> int:
    """No dump in PATH: its text logs, read as `trainguard classify` reads them. Its cross-rank analyses name a
    desync's ranks and collectives from the watchdog lines, or the rank still busy with its own work while the
    others timed out. Without a cause in them either, the missing dumps stay the error (exit 3)."""
    from trainguard.classify import UNKNOWN, classify_paths
    from trainguard.cli.classify import render_classification
    from trainguard.cli.output import print_json, print_text

    try:
        [found] = classify_paths([args.path])
    except InputError:
        raise no_dumps from None
    if found.category == UNKNOWN:
        raise InputError(f"{no_dumps}; its text logs name no cause either ({found.explanation})")
    if args.json:
        print_json({"source": "text-logs", "path": args.path, "no_dumps": str(no_dumps),
                    "classification": found.to_json()})
    else:
        print_text(f"{no_dumps}\nfrom the text logs there (as `trainguard classify` reads them):\n"
                   + render_classification(found))
    return EXIT_FAILURE
