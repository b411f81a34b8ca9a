"""Which link element all failing pairs share: a local HCA port, a GPU's NVLink, a host, or a leaf switch.

Input: the pairs `trainguard.classify.links.LinkCollector` folded a failure's logs into, and an optional
`trainguard.classify.topology.Topology`. The answer is the most specific element that explains (nearly) as
many failing pairs as any element does, or "no common element". Method: docs/classify.md, "Link localization".
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainguard.classify.links import LinkCollector, PairKey, PairStat
from trainguard.classify.topology import Topology

MIN_COVERAGE = 0.8
"""An element must explain at least this share of the failing pairs."""
SPECIFIC_SLACK = 0.05
"""A more specific element wins over a broader one that explains at most this much more."""
TIE_FACTOR = 0.85
"""Confidence is scaled by this when a tie between elements was broken by secondary evidence."""
MAX_PAIRS_SHOWN = 64
EVIDENCE_PAIRS = 16
"""Pairs a diagnosis's evidence lists (failing first); the fleet database counts links from these lines."""
LEVELS = ("nvlink", "hca", "device", "host", "leaf")
"""Element kinds, most specific first."""


@dataclass(frozen=True)
class LinkPair:
    """One local end and one remote end that reported link errors, with what their lines said."""

    kind: str
    """``net`` or ``nvlink``."""
    host: str | None
    port: str | None
    """Local HCA port (``mlx5_3:1``) for ``net``; the GPU's or NVSwitch's PCI address for ``nvlink``."""
    link: int | None
    """NVLink link number."""
    peer: str | None
    """Remote end as printed (an address), if the line names one."""
    peer_host: str | None
    """The remote end's host, when the logs or the topology file map its address; else the address."""
    lines: int
    fatal: int
    transient: int
    local_port_events: int
    statuses: tuple[int, ...]
    evidence: tuple[str, ...]
    """``file:line: text`` of its first lines."""

    @property
    def where(self) -> str:
        """The local end without its host: ``mlx5_3:1``, ``0000:07:00/link5``, or ``-``."""
        where = self.port or "-"
        return f"{where}/link{self.link}" if self.link is not None else where

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "host": self.host, "port": self.port, "link": self.link, "peer": self.peer,
                "peer_host": self.peer_host, "lines": self.lines, "fatal": self.fatal,
                "transient": self.transient, "statuses": list(self.statuses), "evidence": list(self.evidence)}


@dataclass(frozen=True)
class SharedElement:
    """The element the failing pairs have in common."""

    kind: str
    """One of `LEVELS`: ``nvlink`` (one link of a GPU or NVSwitch), ``hca`` (a local HCA port, or its cable),
    ``device`` (a GPU or NVSwitch), ``host``, ``leaf`` (a leaf switch, from the topology file)."""
    name: str
    """Human-readable: ``node-03 mlx5_3:1``, ``node-07``, ``leaf-2``, ``node-01 0000:07:00 link 5``."""
    host: str | None
    port: str | None
    """HCA port, or the device's PCI address for ``nvlink``/``device``."""
    link: int | None
    leaf: str | None
    """The leaf switch (``leaf``; for ``hca``/``host``, the topology's leaf of the host)."""
    cable: str | None
    """The switch port an ``hca`` element's cable plugs into, from the topology file."""
    coverage: float
    """Share of the failing pairs it explains."""
    confidence: float
    pairs: int
    """Failing pairs it explains."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "host": self.host, "port": self.port, "link": self.link,
                "leaf": self.leaf, "cable": self.cable, "coverage": round(self.coverage, 3),
                "confidence": round(self.confidence, 3), "pairs": self.pairs}


@dataclass(frozen=True)
class LinkReport:
    """Link localization of one source."""

    pairs: tuple[LinkPair, ...]
    """Failing pairs first (most lines first), then pairs with only transient errors; at most 64."""
    pairs_total: int
    fatal_pairs: int
    transient_lines: int
    shared: SharedElement | None
    """None: no common element (or only transient errors)."""
    candidates: tuple[tuple[str, str, float], ...] = ()
    """(kind, name, coverage) of the best elements, strongest first (the tied ones when no single one wins)."""
    explanation: str = ""
    dropped_lines: int = 0
    """Lines about pairs beyond the per-source bound (not analysed)."""
    topology: bool = False
    """Whether a topology file was given."""

    def evidence_strings(self) -> tuple[str, ...]:
        """Lines for `trainguard.core.events.Diagnosis.evidence`: the shared element, then one ``link-pair:`` line
        per pair (read back by `parse_link_evidence`)."""
        head = (f"link-shared: {self.shared.kind} {self.shared.name} (confidence {self.shared.confidence:.2f}): "
                if self.shared else "link-shared: none: ") + self.explanation
        pairs = [f"link-pair: {p.host or '?'} {p.where} -> {p.peer_host or '-'}: {p.fatal} failing, "
                 f"{p.transient} transient line(s)" for p in self.pairs[:EVIDENCE_PAIRS]]
        return (head, *pairs)

    def to_json(self) -> dict[str, Any]:
        return {"pairs": [p.to_json() for p in self.pairs], "pairs_total": self.pairs_total,
                "fatal_pairs": self.fatal_pairs, "transient_lines": self.transient_lines,
                "shared": self.shared.to_json() if self.shared else None,
                "candidates": [{"kind": k, "name": n, "coverage": round(c, 3)} for k, n, c in self.candidates],
                "explanation": self.explanation, "dropped_lines": self.dropped_lines, "topology": self.topology}


_Elem = tuple[str, str | None, str | None, int | None]
"""(kind, host-or-leaf, port-or-device, link)."""


def _port_spellings(col: LinkCollector) -> dict[tuple[str | None, str], str]:
    """(host, bare HCA name) -> ``HCA:port`` where the host's lines name exactly one port of that HCA: NCCL's
    completion errors print ``hca mlx5_3``, its async events ``mlx5_3:1``; both are one port."""
    seen: dict[tuple[str | None, str], set[str]] = {}
    for key in col.pairs:
        if key.kind == "net" and key.port and ":" in key.port:
            host = key.host or col.file_hosts.get(key.file)
            seen.setdefault((host, key.port.split(":", 1)[0]), set()).add(key.port)
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


def _resolve(col: LinkCollector, topo: Topology | None) -> list[LinkPair]:
    merged: dict[tuple[Any, ...], list[Any]] = {}
    spelled = _port_spellings(col)
    for key, st in col.pairs.items():
        host = key.host or col.file_hosts.get(key.file)
        peer_host = _peer_host(key, col, topo)
        port = spelled.get((host, key.port), key.port) if key.kind == "net" and key.port else key.port
        k = (key.kind, host, port, key.link, key.peer, peer_host)
        acc = merged.setdefault(k, [PairStat(), []])
        a: PairStat = acc[0]
        a.lines += st.lines
        a.fatal += st.fatal
        a.transient += st.transient
        a.local_port_events += st.local_port_events
        a.statuses |= st.statuses
        acc[1].extend(f"{f}:{n}: {t}" for f, n, t in st.examples)
    out = [LinkPair(k[0], k[1], k[2], k[3], k[4], k[5], a.lines, a.fatal, a.transient, a.local_port_events,
                    tuple(sorted(a.statuses)), tuple(ev[:2])) for k, (a, ev) in merged.items()]
    out.sort(key=lambda p: (p.fatal == 0, -p.lines, str(p.host), str(p.port), str(p.peer_host)))
    return out


def _peer_host(key: PairKey, col: LinkCollector, topo: Topology | None) -> str | None:
    if key.peer is None:
        return None
    addr = key.peer.lower()
    return (topo.addresses.get(addr) if topo else None) or col.addresses.get(addr) or key.peer


def _elements(p: LinkPair, topo: Topology | None) -> list[_Elem]:
    """The elements a failing pair names."""
    out: list[_Elem] = []
    if p.kind == "nvlink":
        if p.link is not None:
            out.append(("nvlink", p.host, p.port, p.link))
        out.append(("device", p.host, p.port, None))
    elif p.port is not None:
        out.append(("hca", p.host, p.port, None))
    for h in (p.host, p.peer_host):
        if h is not None:
            out.append(("host", h, None, None))
            leaf = topo.leaf_of(h) if topo else None
            if leaf is not None:
                out.append(("leaf", leaf, None, None))
    return out


def _coverage(failing: list[LinkPair], topo: Topology | None) -> Counter[_Elem]:
    """How many failing pairs each named element explains, in one pass. A host, leaf, GPU or NVLink explains
    exactly the pairs that name it; an HCA port explains its own host's reports through it and its peers'
    reports about its host (which of the host's ports a peer reached is not in the peer's line)."""
    named: Counter[_Elem] = Counter()
    about_host: Counter[str] = Counter()  # net pairs reported by another host about this one
    for p in failing:
        named.update(set(_elements(p, topo)))
        if p.kind == "net" and p.peer_host is not None and p.peer_host != p.host:
            about_host[p.peer_host] += 1
    for e in [e for e in named if e[0] == "hca"]:
        named[e] += about_host[e[1]] if e[1] is not None else 0
    return named


def _name(e: _Elem) -> str:
    kind, who, port, link = e
    if kind == "nvlink":
        return f"{who or '?'} {port} link {link}"
    if kind in ("hca", "device"):
        return f"{who or '?'} {port}"
    return str(who)


def _tiebreak(kind: str, failing: list[LinkPair], topo: Topology | None) -> Callable[[_Elem], tuple[int, ...]]:
    """Secondary evidence among equally covering elements, smaller first: a port that reported errors about
    itself (IB async events) before one that did not; a host that is only named by its peers (silent: it
    died or cannot log) before one that reports errors itself; the leaf more of whose hosts are in failing
    pairs (a broken leaf cuts all its hosts off, a healthy one only those talking to the broken one)."""
    if kind == "hca":
        own = Counter({(p.host, p.port): p.local_port_events for p in failing})
        return lambda e: (-own[(e[1], e[2])],)
    if kind == "host":
        reports = Counter(p.host for p in failing)
        return lambda e: (reports[e[1]],)
    if kind == "leaf" and topo is not None:
        hosts = {h for p in failing for h in (p.host, p.peer_host) if h is not None}
        under = Counter(topo.leaf_of(h) for h in hosts)
        return lambda e: (-under[e[1]],)
    return lambda e: (0,)


def analyze(col: LinkCollector, topo: Topology | None = None) -> LinkReport | None:
    """The link report of one source, or None when its logs hold no link line."""
    pairs = _resolve(col, topo)
    if not pairs and not col.dropped:
        return None
    failing = [p for p in pairs if p.fatal]
    transient = sum(p.transient for p in pairs)
    base: dict[str, Any] = {"pairs": tuple(pairs[:MAX_PAIRS_SHOWN]), "pairs_total": len(pairs),
                            "fatal_pairs": len(failing), "transient_lines": transient, "dropped_lines": col.dropped,
                            "topology": topo is not None}
    if not failing:
        return LinkReport(shared=None, explanation=f"no failing link: {transient} transient line(s) "
                          f"(retries, non-fatal errors) on {len(pairs)} pair(s), nothing in common to blame",
                          **base)
    coverage = _coverage(failing, topo)
    named = set(coverage)
    n = len(failing)
    if not coverage:  # failing lines that name no host, port or peer (a bare "port error" with no prefix)
        return LinkReport(shared=None, explanation=f"no common element: {n} failing pair(s) name no host, "
                          "port or peer", **base)
    best_overall = max(coverage.values()) / n
    ranked = sorted(named, key=lambda e: (-coverage[e], LEVELS.index(e[0]), _name(e)))
    cands = tuple((e[0], _name(e), coverage[e] / n) for e in ranked[:5])
    if best_overall < MIN_COVERAGE:
        return LinkReport(shared=None, candidates=cands, explanation=(
            f"no common element: {n} failing pair(s), the most shared element ({cands[0][1]}) is in "
            f"{coverage[ranked[0]]} of them"), **base)
    for kind in LEVELS:
        level = [e for e in named if e[0] == kind]
        if not level:
            continue
        top = max(coverage[e] for e in level)
        if top / n < max(MIN_COVERAGE, best_overall - SPECIFIC_SLACK):
            continue
        tied = sorted((e for e in level if coverage[e] == top), key=_name)
        factor = 1.0
        if len(tied) > 1:
            key = _tiebreak(kind, failing, topo)
            first = min(key(e) for e in tied)
            tied = [e for e in tied if key(e) == first]
            factor = TIE_FACTOR
        if len(tied) > 1:
            names = " and ".join(_name(e) for e in tied[:4])
            return LinkReport(shared=None, candidates=tuple((e[0], _name(e), top / n) for e in tied),
                              explanation=f"no single element: {names} are each in all {top} failing pair(s) "
                                          "and nothing tells them apart", **base)
        return _report(tied[0], top, n, factor, topo, base, cands)
    raise AssertionError("the best element belongs to some level")  # pragma: no cover


def _report(e: _Elem, covered: int, n: int, factor: float, topo: Topology | None, base: dict[str, Any],
            cands: tuple[tuple[str, str, float], ...]) -> LinkReport:
    kind, who, port, link = e
    size = min(0.95, 0.5 + 0.15 * (n - 1))  # one failing pair is a weak basis; four or more a firm one
    confidence = round(covered / n * size * factor, 3)
    host = who if kind != "leaf" else None
    leaf = who if kind == "leaf" else (topo.leaf_of(who) if topo else None)
    cable = topo.cable_of(who, port) if topo and kind == "hca" else None
    shared = SharedElement(kind, _name(e), host, port, link, leaf, cable, covered / n, confidence, covered)
    what = {"nvlink": "NVLink", "hca": "local HCA port" + (f" (or its cable to {cable})" if cable else ""),
            "device": "GPU/NVSwitch", "host": "host", "leaf": "leaf switch"}[kind]
    note = " (tie broken by the port's own error events or by which host stayed silent)" if factor < 1 else ""
    return LinkReport(shared=shared, candidates=cands, explanation=(
        f"{covered} of {n} failing pair(s) share the {what} {shared.name}{note}"), **base)


_EVIDENCE_PAIR = re.compile(r"^link-pair: (?P<host>\S+) (?P<where>\S+) -> (?P<peer>\S+): (?P<fatal>\d+) failing, "
                            r"(?P<transient>\d+) transient")


def parse_link_evidence(line: str) -> tuple[str, str, int, int] | None:
    """(host, ``where -> peer``, failing lines, transient lines) of a ``link-pair:`` evidence line, else None."""
    m = _EVIDENCE_PAIR.match(line)
    if m is None or m.group("host") == "?":
        return None
    return (m.group("host"), f"{m.group('where')} -> {m.group('peer')}", int(m.group("fatal")),
            int(m.group("transient")))
