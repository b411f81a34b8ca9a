"""``trainguard classify LOGS...``: root cause of an interruption in Llama 3 Table 5 categories."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from trainguard.errors import UsageError

if TYPE_CHECKING:
    from trainguard.classify import Classification, LinkReport

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
    parser.add_argument("--topology", metavar="FILE",
                        help="network topology (JSON or TOML: host -> leaf switch, HCA -> switch port) so link "
                             "localization can name a leaf switch or cable (docs/classify.md)")


def render_classification(c: Classification) -> str:
    """One classification as the terminal shows it (also `trainguard diagnose` on text logs)."""
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
    if c.links is not None:
        lines.extend(_render_links(c.links))
    return "\n".join(lines)


def _render_links(r: LinkReport) -> list[str]:
    shared = r.shared
    head = (f"  link: {shared.kind} {shared.name}, confidence {shared.confidence:.2f}" if shared
            else "  link: no common element")
    out = [head, f"    why: {r.explanation}"]
    for p in r.pairs[:8]:
        local = " ".join(x for x in (p.host or "?", p.port or "", f"link {p.link}" if p.link is not None else "") if x)
        peer = f" -> {p.peer_host}" if p.peer_host else ""
        out.append(f"    {local}{peer}: {p.fatal} failing, {p.transient} transient line(s)")
    if len(r.pairs) > 8:
        out.append(f"    ... {r.pairs_total - 8} more pair(s) (--json lists them)")
    return out


def run(args: argparse.Namespace) -> int:
    from trainguard.classify import DEFAULT_MAX_BYTES, classify_paths, load_rules, load_topology
    from trainguard.cli.output import print_json, print_text

    max_bytes = DEFAULT_MAX_BYTES if args.max_bytes is None else args.max_bytes
    if max_bytes < 0:
        raise UsageError(f"--max-bytes must be >= 0, got {max_bytes}")
    rules = load_rules(*args.rules) if args.rules else None
    topology = load_topology(args.topology) if args.topology else None
    results = classify_paths(args.logs, verdict=args.verdict, rules=rules, max_bytes=max_bytes,
                             combine=args.combine, topology=topology)
    if args.json:
        print_json([c.to_json() for c in results])
    else:
        print_text("\n\n".join(render_classification(c) for c in results))
    return 0
