"""``trainguard classify LOGS...``: root cause of an interruption in Llama 3 Table 5 categories."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from trainguard.errors import UsageError

if TYPE_CHECKING:
    from trainguard.classify import Classification

HELP = "root-cause category (Llama 3 Table 5) of failure logs, with the evidence lines"

_VERDICTS = ("hang", "p2p-hang", "desync", "mismatch", "crash", "healthy", "sdc")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help="log files (plain, .gz, torchelastic error.json), directories of them, or - for stdin")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one entry per LOG")
    parser.add_argument("--rules", action="append", default=[], metavar="FILE",
                        help="extra TOML rules that extend or override the built-in ones (repeatable)")
    parser.add_argument("--verdict", choices=_VERDICTS,
                        help="localization verdict to combine with the logs (from `trainguard diagnose`)")
    parser.add_argument("--combine", action="store_true",
                        help="treat all LOGS as one source (the evidence of one failure)")
    parser.add_argument("--max-bytes", type=int, default=None, metavar="N",
                        help="refuse files larger than N bytes (default 16 GiB; 0 = no limit)")


def _render(c: Classification) -> str:
    lines = [f"{c.source}: {c.category} ({c.group}), confidence {c.confidence:.2f}"]
    suspect = [f"host {c.host}" if c.host else "", f"GPU {c.gpu}" if c.gpu else "",
               f"device {c.device}" if c.device and c.device != c.gpu else ""]
    if any(suspect):
        lines.append("  suspect: " + ", ".join(p for p in suspect if p))
    if c.explanation:
        lines.append(f"  why: {c.explanation}")
    for e in c.evidence:
        cause = f", consequence of {e.explained_by}" if e.explained_by else ""
        lines.append(f"  {e.file}:{e.line}: [{e.category}{cause}] {e.text[:200]}")
    if c.alternatives:
        lines.append("  also: " + ", ".join(f"{cat} ({p:.2f})" for cat, p in c.alternatives))
    for s in c.skipped:
        lines.append(f"  skipped: {s}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from trainguard.classify import DEFAULT_MAX_BYTES, classify_paths, load_rules
    from trainguard.cli.output import print_json, print_text

    max_bytes = DEFAULT_MAX_BYTES if args.max_bytes is None else args.max_bytes
    if max_bytes < 0:
        raise UsageError(f"--max-bytes must be >= 0, got {max_bytes}")
    rules = load_rules(*args.rules) if args.rules else None
    results = classify_paths(args.logs, verdict=args.verdict, rules=rules, max_bytes=max_bytes,
                             combine=args.combine)
    if args.json:
        print_json([c.to_json() for c in results])
    else:
        print_text("\n\n".join(_render(c) for c in results))
    return 0
