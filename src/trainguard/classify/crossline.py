"""Evidence no single line carries: many GPUs of a host lost in the same second, a sensor that jumps
implausibly, one replica whose checksum differs from all the others. Configured as ``[[crossline]]`` data.

This module holds their configuration (and `Explains`, which rules share); `trainguard.classify.derive` runs them.
Each analysis reads hits the scanner already kept (XID and rule lines, or the lines of a *readings* rule,
whose hits are inputs there and never evidence themselves) and adds one synthetic hit: a cause that may
``explain`` later lines like any rule's (docs/classify.md, "Evidence across lines").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from trainguard.core.taxonomy import TABLE5_GROUPS, UNKNOWN
from trainguard.errors import InputError

KINDS = ("simultaneous", "jump", "divergence", "busy", "desync", "release")


class _Readings(Protocol):
    """What a ``readings`` rule must offer here: its compiled pattern (its groups are checked)."""

    @property
    def pattern(self) -> Any: ...


EXPLAIN_SCOPES = ("below", "device", "host", "source")
"""Where a cause's consequences may lie (see `Explains.scope`)."""


@dataclass(frozen=True)
class Explains:
    """Which later errors a rule's line explains: an upstream component's failure is the cause of the errors
    its downstream devices report after it (a PCIe switch port's fatal error, then its GPUs off the bus)."""

    categories: tuple[str, ...]
    """Categories of the consequence lines (e.g. ``Faulty GPU`` for GPUs that fell off the bus)."""
    scope: str = "below"
    """``below``: devices under the line's PCI ``device`` (by bus number, or the bridge's bus range when the
    log prints it); ``device``: that device itself and below; ``host``: the same host; ``source``: anywhere in
    the source."""
    min_devices: int = 1
    """Explain only when at least this many distinct components (PCI devices; else lines) fail after it: one
    GPU under a switch port that reports the link to it down is more likely the GPU's own fault."""
    rules: tuple[str, ...] = ()
    """If given, only lines of these rules are explained (an NFS outage explains Python's EIO, not an NVMe
    controller's own I/O errors)."""
    within_s: float | None = None
    """A window of its own instead of ``explain_window_s`` (a driver retries a silent GSP for minutes)."""




@dataclass(frozen=True)
class CrossLine:
    """One analysis over several lines (see `KINDS`)."""

    id: str
    """Rule id of the synthetic hit it adds."""
    kind: str
    """``simultaneous``: at least ``min_devices`` distinct devices of one host report a hit of ``categories``
    within ``within_s``; ``jump``: a reading of the ``readings`` rule (groups ``sensor``, ``value``) rises by
    ``min_rise`` within ``within_s`` while every other sensor rises by less than ``calm`` (an optional group
    ``index`` is part of the sensor's name: one metric over many GPUs); ``divergence``: among
    at least ``min_replicas`` rows of the ``readings`` rule (groups ``replica``, ``value``; rows grouped by their
    step number), all replicas but one agree; ``busy``: a line of the ``readings`` rule (rank-local work: saving,
    evaluating, preparing data) is followed, within ``within_s``, by a hit of ``categories`` (collective
    timeouts): the others waited for the busy rank; ``desync``: the ``readings`` rule's timeout rows (groups
    ``replica``, ``seq``, ``op``, optional ``pg``) of at least two ranks of one process group name different
    collectives (sequence number or type): the ranks disagree about which collective comes next; ``release``: the
    ``readings`` rule's lines (group ``version``) name an NCCL release that `trainguard.classify.nccl_releases`
    lists as defective, and the log shows a failure of that defect's symptom (lines of the ``symptoms`` rules)."""
    category: str
    confidence: float
    explain: str
    categories: tuple[str, ...] = ()
    """``simultaneous``: the categories of the lines counted."""
    prefer: tuple[str, ...] = ()
    """``simultaneous``: a category that has its own evidence on the same host is taken instead of ``category``
    (the chassis whose fans failed, rather than the power)."""
    readings: str = ""
    """``jump``/``divergence``: id of the rule whose lines are the series."""
    min_devices: int = 4
    within_s: float = 2.0
    within_lines: int = 0
    """``busy``: the work line must lie at most this many lines before the first timeout of its file (0: no
    limit). A full job log has the training's own lines between a phase long over and a later timeout."""
    min_rise: float = 40.0
    calm: float = 10.0
    min_replicas: int = 3
    explains: Explains | None = None
    """What the synthetic hit explains, as for a rule."""
    symptoms: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """``release``: (symptom, ids of the rules whose lines show it), e.g. ("hang", ("nccl-watchdog-timeout",))."""
    context: str = ""
    """``release``: id of a readings rule whose lines are the conditions an entry may require (and NCCL's
    ``... set by environment to ...`` settings that switch a defective feature off)."""


def _num(where: str, d: Mapping[str, Any], key: str, default: float, lo: float) -> float:
    v = d.get(key, default)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v < lo:
        raise InputError(f"{where}: {key} must be a number >= {lo}, got {v!r}")
    return float(v)


def parse_crossline(where: str, d: Mapping[str, Any], explains: Callable[[str, Any], Explains | None],
                    rules: Mapping[str, _Readings]) -> CrossLine:
    """One ``[[crossline]]`` table (``rules``: the rules loaded so far, for ``readings``)."""
    cid = d.get("id")
    if not isinstance(cid, str) or not cid:
        raise InputError(f"{where}: every [[crossline]] needs an id")
    where = f"{where}: crossline {cid!r}"
    kind = d.get("kind")
    if kind not in KINDS:
        raise InputError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    cats = [d.get("category"), *d.get("categories", []), *d.get("prefer", [])]
    bad = [c for c in cats if c != UNKNOWN and c not in TABLE5_GROUPS]
    if bad:
        raise InputError(f"{where}: unknown category {bad[0]!r}")
    readings = str(d.get("readings", ""))
    if kind != "simultaneous":
        rule = rules.get(readings)
        need = {"jump": ("sensor", "value"), "divergence": ("replica", "value"), "busy": (),
                "desync": ("replica", "seq", "op"), "release": ("version",)}[str(kind)]
        if rule is None or any(g not in rule.pattern.groupindex for g in need):
            raise InputError(f"{where}: readings must name a rule with groups {', '.join(need)}")
    symptoms, context = _release_inputs(where, d, rules) if kind == "release" else ((), "")
    return CrossLine(
        id=cid, kind=str(kind), category=str(d.get("category")),
        confidence=_num(where, d, "confidence", 0.7, 0.0), explain=str(d.get("explain", "")),
        categories=tuple(d.get("categories", [])), prefer=tuple(d.get("prefer", [])), readings=readings,
        min_devices=int(_num(where, d, "min_devices", 4, 2)), within_s=_num(where, d, "within_s", 2.0, 0.0),
        within_lines=int(_num(where, d, "within_lines", 0, 0)),
        min_rise=_num(where, d, "min_rise", 40.0, 0.0), calm=_num(where, d, "calm", 10.0, 0.0),
        min_replicas=int(_num(where, d, "min_replicas", 3, 3)), explains=explains(where, d.get("explains")),
        symptoms=symptoms, context=context,
    )


def _release_inputs(where: str, d: Mapping[str, Any], rules: Mapping[str, _Readings]
                    ) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], str]:
    """A ``release`` analysis's ``symptoms`` table (symptom -> rule ids) and optional ``context`` readings rule."""
    table = d.get("symptoms")
    if not isinstance(table, dict) or not table:
        raise InputError(f"{where}: symptoms must be a table: {{crash = [rule ids], hang = [rule ids]}}")
    out = []
    for symptom, ids in table.items():
        if not isinstance(ids, list) or not ids or not all(isinstance(x, str) and x in rules for x in ids):
            raise InputError(f"{where}: symptoms.{symptom} must be a list of ids of rules defined before it")
        out.append((str(symptom), tuple(ids)))
    context = str(d.get("context", ""))
    if context and context not in rules:
        raise InputError(f"{where}: context must name a rule defined before it")
    return tuple(out), context
