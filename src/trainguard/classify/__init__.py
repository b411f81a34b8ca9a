"""Root-cause classification of training interruptions into Llama 3's Table 5 categories.

Deterministic and explainable: rules kept as data (``rules.toml``, extensible) map log evidence to a
category, its group, a confidence, the evidence lines, and the suspected host and GPU. Pure analysis:
no torch, no network. See docs/classify.md.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from trainguard.classify.engine import Classification, EvidenceLine, decide
from trainguard.classify.linkverdict import LinkReport, SharedElement, analyze, parse_link_evidence
from trainguard.classify.rules import BUILTIN_RULES, Rule, RuleSet, load_rules
from trainguard.classify.scan import Accumulator, Scanner
from trainguard.classify.sources import (
    DEFAULT_MAX_BYTES,
    JSON_MAX_BYTES,
    check_file,
    scan_dir,
    scan_file,
    scan_stream_checked,
)
from trainguard.classify.structured import as_structured
from trainguard.classify.tiers import TIERS
from trainguard.classify.topology import Topology, load_topology
from trainguard.classify.xid import is_hardware_xid, xid_code
from trainguard.core.taxonomy import GROUPS, TABLE5_CATEGORIES, UNKNOWN, group_of
from trainguard.errors import InputError

__all__ = [
    "BUILTIN_RULES",
    "DEFAULT_MAX_BYTES",
    "GROUPS",
    "TABLE5_CATEGORIES",
    "TIERS",
    "UNKNOWN",
    "Classification",
    "EvidenceLine",
    "LinkReport",
    "Rule",
    "RuleSet",
    "SharedElement",
    "Topology",
    "check_file",
    "classify_paths",
    "classify_text",
    "default_rules",
    "group_of",
    "is_hardware_xid",
    "load_rules",
    "load_topology",
    "parse_link_evidence",
    "xid_code",
]


@lru_cache(maxsize=1)
def default_rules() -> RuleSet:
    """The built-in rules, loaded once per process."""
    return load_rules()


@lru_cache(maxsize=4)
def _scanner(rules: RuleSet | None) -> Scanner:
    return Scanner(rules if rules is not None else default_rules())


def _decide(source: str, acc: Accumulator, rules: RuleSet, verdict: str | None,
            topology: Topology | None) -> Classification:
    c = decide(source, acc, rules, verdict)
    links = analyze(acc.links, topology)
    return replace(c, links=links) if links is not None else c


def classify_text(text: str, source: str, *, verdict: str | None = None, rules: RuleSet | None = None,
                  topology: Topology | None = None) -> Classification:
    """Classify a log held in memory; ``source`` names it in the evidence. ``topology`` helps link
    localization name a leaf switch or cable (`load_topology`)."""
    scanner = _scanner(rules)
    acc = Accumulator(files=1)
    # a JSON document or a CSV table is read as data (one line per record), a log as lines
    data = as_structured(text) if len(text) <= JSON_MAX_BYTES else None
    scanner.scan_stream(io.BytesIO((data if data is not None else text).encode("utf-8", "replace")), source, acc)
    return _decide(source, acc, scanner.rules, verdict, topology)


def classify_paths(paths: Iterable[str | Path], *, verdict: str | None = None,
                   rules: RuleSet | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                   combine: bool = False, topology: Topology | None = None) -> list[Classification]:
    """One classification per path (a file, ``-`` for standard input, or a directory whose text files
    count as one source).

    With ``combine``, all paths form one source (the evidence of a failed attempt spread over files).
    Raises `InputError` for a missing, unreadable, binary or too large file named directly.
    """
    scanner = _scanner(rules)
    items = [Path(p) for p in paths]
    if not items:
        raise InputError("no input files given")
    groups = [items] if combine else [[p] for p in items]
    out: list[Classification] = []
    for group in groups:
        acc = Accumulator()
        for p in group:
            if str(p) == "-":
                scan_stream_checked(scanner, sys.stdin.buffer, "<stdin>", acc)
            elif p.is_dir():
                scan_dir(scanner, p, acc, max_bytes)
            else:
                scan_file(scanner, p, acc, max_bytes)
        source = str(group[0]) if len(group) == 1 else ",".join(str(p) for p in group)
        out.append(_decide(source, acc, scanner.rules, verdict, topology))
    return out
