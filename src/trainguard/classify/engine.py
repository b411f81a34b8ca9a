"""From collected hits to one verdict: cause before consequence, precedence, confidence, evidence, suspect."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from trainguard.classify.context import is_below
from trainguard.classify.derive import derive
from trainguard.classify.killed import killed_summary
from trainguard.classify.linkverdict import LinkReport
from trainguard.classify.rules import Explains, RuleSet
from trainguard.classify.scan import Accumulator, Hit
from trainguard.classify.tiers import TIERS
from trainguard.core.taxonomy import UNKNOWN, group_of

log = logging.getLogger(__name__)

MAX_EVIDENCE = 10
AMBIGUITY_FACTOR = 0.85
"""A winner's confidence is scaled by this when a strong rival of the same tier names another category."""


@dataclass(frozen=True)
class EvidenceLine:
    """One log line that supports a classification."""

    file: str
    line: int
    """1-based line number in ``file`` (for JSON files: in the decoded text, see docs/classify.md)."""
    text: str
    rule: str = ""
    """Id of the rule (``xid-<code>`` for XIDs, ``verdict-<name>`` for localization verdicts)."""
    category: str = ""
    """What this line alone points to."""
    explained_by: str | None = None
    """``file:line`` of the upstream failure this line is a consequence of, if any."""

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "text": self.text, "rule": self.rule,
                "category": self.category, "explained_by": self.explained_by}


@dataclass(frozen=True)
class Classification:
    """The root cause of one source (a log file, a directory of logs, or a text)."""

    source: str
    category: str
    """Table 5 category, or ``Unknown``."""
    group: str
    """Table 5 group of the category (``Unknown`` for ``Unknown`` and NCCL watchdog timeouts)."""
    confidence: float
    evidence: tuple[EvidenceLine, ...] = ()
    """The key line first, then more support, then the strongest line of each alternative."""
    host: str | None = None
    """Suspected host: from the key line's syslog prefix, else a torchelastic ``host :`` line."""
    gpu: str | None = None
    """Suspected GPU as its PCI bus id (``dddd:bb:dd``, from XID lines or an ``nvidia-smi -q`` section), if any."""
    device: str | None = None
    """Suspected component's PCI address when the key line names one (the GPU; for a PCIe fault the port or
    switch whose failure explains its downstream devices' errors)."""
    explanation: str = ""
    alternatives: tuple[tuple[str, float], ...] = ()
    """Other categories with evidence, (category, confidence), strongest first."""
    xids: dict[int, int] = field(default_factory=dict)
    """XID code -> number of lines."""
    verdict: str | None = None
    lines: int = 0
    """Lines read."""
    truncated_lines: int = 0
    files: int = 0
    skipped: tuple[str, ...] = ()
    """Files of a directory that were not read (binary, unreadable), with the reason."""
    links: LinkReport | None = None
    """Link localization (failing pairs and the element they share); None when no line names a link."""

    def evidence_strings(self) -> tuple[str, ...]:
        """``file:line: text`` per evidence line, for `trainguard.core.events.Diagnosis.evidence` (the fleet
        database reads XID codes from these strings)."""
        return tuple(f"{e.file}:{e.line}: {e.text}" for e in self.evidence)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "category": self.category,
            "group": self.group,
            "confidence": round(self.confidence, 3),
            "evidence": [e.to_json() for e in self.evidence],
            "host": self.host,
            "gpu": self.gpu,
            "device": self.device,
            "explanation": self.explanation,
            "alternatives": [{"category": c, "confidence": round(p, 3)} for c, p in self.alternatives],
            "xids": {str(k): v for k, v in sorted(self.xids.items())},
            "verdict": self.verdict,
            "lines": self.lines,
            "truncated_lines": self.truncated_lines,
            "files": self.files,
            "skipped": list(self.skipped),
            "links": self.links.to_json() if self.links is not None else None,
        }


@dataclass
class _Candidate:
    category: str
    confidence: float
    tier: str
    hits: list[Hit]
    explain: str
    first: int


def _before(cause: Hit, effect: Hit, window: float) -> bool:
    """Whether ``effect`` happened after ``cause`` (and within ``window`` seconds): by their time stamps when
    both have one on the same clock, else by their order in the source."""
    if cause.time is not None and effect.time is not None and cause.time[0] == effect.time[0]:
        delta = effect.time[1] - cause.time[1]
        return 0 <= delta <= window and (delta > 0 or effect.order > cause.order)
    return effect.order > cause.order


def _related(ex: Explains, cause: Hit, effect: Hit, acc: Accumulator, endpoints: set[str]) -> bool:
    """Whether ``effect`` lies downstream of ``cause`` in the rule's scope."""
    scope = ex.scope
    if scope == "source":
        return True
    if scope == "host":
        return cause.host is None or effect.host is None or cause.host == effect.host
    if cause.device is None or effect.device is None:
        return False
    if scope == "below" and cause.device in endpoints:
        return False  # a GPU reported the error itself: nothing is below an endpoint
    return is_below(effect.device, cause.device, acc.bridges, same_counts=scope == "device")


def _explain(hits: list[Hit], acc: Accumulator, rules: RuleSet) -> tuple[list[Hit], dict[int, str]]:
    """Find the errors that an upstream failure explains (cause before consequence, by time and topology).

    Returns the hits, those explained marked with ``explained_by``, and for each of them (by ``order``) the
    category it counts for: that of its root cause. Causes are taken in order, so the earliest upstream failure
    claims its consequences; a cause that is itself explained hands what it explains on to its own cause."""
    by_id = explainers(rules)
    # a synthetic cause (a crossline analysis, negative order) takes only what no line of the log explains
    causes = sorted((h for h in hits if h.rule in by_id), key=lambda h: (h.order < 0, h.order))
    if not causes:
        return hits, {}
    endpoints = {h.device for h in hits if h.rule.startswith("xid-") and h.device}
    current = {h.order: h for h in hits}
    claimed: set[int] = set()
    for cause in causes:
        ex = by_id[cause.rule]
        window = rules.explain_window_s if ex.within_s is None else ex.within_s
        effects = [h for h in current.values()
                   if h.order != cause.order and h.explained_by is None and h.category in ex.categories
                   # a rule that names its consequences' rules may explain its own category (an NFS outage, then
                   # the job's EIO: both Dependency); one that does not, only other categories
                   and (h.rule in ex.rules if ex.rules else h.category != cause.category)
                   and _before(cause, h, window) and _related(ex, cause, h, acc, endpoints)]
        components = {_component(h.device or h.gpu) or f"{h.file}:{h.line}" for h in effects}
        if not effects or len(components) < ex.min_devices:
            continue
        log.debug("%s:%d explains %d later line(s)", cause.file, cause.line, len(effects))
        claimed.add(cause.order)
        for h in effects:
            current[h.order] = replace(h, explained_by=cause.order)
    for order in [o for o in current if o < 0 and o not in claimed and not _names_own(current[o], by_id, current)]:
        del current[order]  # its lines are explained by the log's own cause: it adds nothing
    attributed: dict[int, str] = {}
    for order, h in current.items():
        root, seen = h, {order}
        while root.explained_by is not None and root.explained_by not in seen:
            seen.add(root.explained_by)
            root = current[root.explained_by]
        if root is not h:
            attributed[order] = root.category
    return list(current.values()), attributed


def _names_own(cause: Hit, by_id: dict[str, Explains], current: dict[int, Hit]) -> bool:
    """Whether a synthetic cause that claimed nothing still reads lines of its own category among the rules it
    explains (a known-bad NCCL release and a crash inside libnccl.so, both Dependency: it says which defect)."""
    ex = by_id[cause.rule]
    return bool(ex.rules) and any(h.explained_by is None and h.rule in ex.rules and h.category == cause.category
                                  for h in current.values())


def _component(device: str | None) -> str | None:
    """The physical device of a PCI function: a GPU's audio function (``0000:03:00.1``) is the GPU
    (``0000:03:00``), so a GPU with its two functions counts as one device, not two."""
    return device.rsplit(".", 1)[0] if device and device.count(":") == 2 and "." in device else device


def explainers(rules: RuleSet) -> dict[str, Explains]:
    """Rule id -> what its lines explain: rules, XID meanings (``xid-<code>``) and crossline analyses."""
    out = {r.id: r.explains for r in rules.rules if r.explains is not None}
    out.update({f"xid-{code}": x.explains for x in rules.xids if x.explains is not None for code in x.codes})
    out.update({c.id: c.explains for c in rules.crosslines if c.explains is not None})
    return out


def _candidates(acc: Accumulator, rules: RuleSet, verdict: str | None) -> list[_Candidate]:
    yields = {r.id: r.yields_to for r in rules.rules if r.yields_to}
    hits, attributed = _explain(derive([h for hs in acc.hits.values() for h in hs], rules), acc, rules)
    own = {h.category for h in hits if h.rule not in yields and h.order not in attributed}
    by_cat: dict[str, list[Hit]] = {}
    for h in hits:
        target = attributed.get(h.order) or next((c for c in yields.get(h.rule, ()) if c in own), h.category)
        # an explained line keeps its own category (what it alone points to); a yielding one takes the target's
        by_cat.setdefault(target, []).append(h if h.order in attributed or target == h.category
                                             else replace(h, category=target))
    out: list[_Candidate] = []
    for cat, cat_hits in by_cat.items():
        # the cause's own lines lead; lines it explains only support it (a GPU off the bus is not the key line
        # of a switch failure, however sure its XID is)
        cat_hits.sort(key=lambda h: (h.explained_by is not None, -h.confidence, h.order))
        best = cat_hits[0]
        distinct = len({h.rule for h in cat_hits})
        conf = min(0.99, best.confidence + 0.05 * (distinct - 1))
        tiers = [h.tier for h in cat_hits if h.confidence == best.confidence and h.explained_by is None]
        tier = min(tiers or [best.tier], key=TIERS.index)
        out.append(_Candidate(cat, conf, tier, cat_hits, best.explain, min(h.order for h in cat_hits)))
    if verdict:
        for v in rules.verdicts:
            if v.verdict == verdict:
                existing = next((c for c in out if c.category == v.category), None)
                if existing is not None:
                    existing.confidence = min(0.99, max(existing.confidence, v.confidence) + 0.05)
                    existing.explain = f"{existing.explain}; {v.explain}"
                else:
                    out.append(_Candidate(v.category, v.confidence, v.tier, [], v.explain, 1 << 62))
    return out


def _explained_note(win: _Candidate, rules: RuleSet) -> str:
    """Says which later errors the winner's key line explains, and on which devices."""
    effects = [h for h in win.hits if h.explained_by is not None]
    if not win.hits or not effects:
        return ""
    key = win.hits[0]
    lines = {(h.file, h.line) for h in effects}
    devices = sorted({h.device for h in effects if h.device})
    cats = sorted({h.category for h in effects if h.category != UNKNOWN}) or [UNKNOWN]
    ex = explainers(rules).get(key.rule)
    below = ex is not None and ex.scope in ("below", "device")
    where = ""
    if devices:
        shown = ", ".join(devices[:6]) + (" ..." if len(devices) > 6 else "")
        where = f" of {len(devices)} device(s) {'below it' if below else 'on the same host'} ({shown})"
    return (f"it comes first ({key.file}:{key.line}) and explains the {len(lines)} later error line(s){where} "
            f"that alone would point to {', '.join(cats)}")


def decide(source: str, acc: Accumulator, rules: RuleSet, verdict: str | None = None) -> Classification:
    """Pick the root cause: strong signals by tier (hardware first), then confidence, then order."""
    cands = _candidates(acc, rules, verdict)
    strong = rules.strong_confidence

    def rank(c: _Candidate) -> tuple[int, int, float, int]:
        unknown = 1 if c.category == UNKNOWN else 0
        tier = TIERS.index(c.tier) if c.confidence >= strong else len(TIERS)
        return (unknown, tier, -c.confidence, c.first)

    cands.sort(key=rank)
    context_host = acc.context_hosts[0] if acc.context_hosts else None
    base = Classification(
        source=source, category=UNKNOWN, group=UNKNOWN, confidence=0.0, host=context_host,
        explanation="no known failure signature in the input", xids=dict(acc.xids), verdict=verdict,
        lines=acc.lines, truncated_lines=acc.truncated_lines, files=acc.files, skipped=tuple(acc.skipped))
    if not cands:
        return base
    win = cands[0]
    rivals = [c for c in cands[1:] if c.category != UNKNOWN]
    confidence = win.confidence
    notes = [win.explain]
    if win.category == UNKNOWN:
        confidence = min(confidence, 0.2)
        killed = killed_summary(win.hits)
        # a process killed from outside, with nothing else in its logs, is said as such in one line
        notes = [killed] if killed else ["no rule names a cause; best partial evidence: " + win.explain]
    elif any(c.tier == win.tier and c.confidence >= strong for c in rivals) and win.confidence >= strong:
        confidence *= AMBIGUITY_FACTOR
        notes.append("other strong signals of the same kind are present (see alternatives)")
    elif rivals and win.tier != rivals[0].tier and rivals[0].confidence >= strong:
        notes.append(f"outranks {rivals[0].category} ({rivals[0].tier} signals yield to {win.tier} ones)")
    if win.category != UNKNOWN:
        notes.append(_explained_note(win, rules))

    where = {h.order: f"{h.file}:{h.line}" for c in cands for h in c.hits}
    evidence: list[EvidenceLine] = []
    seen: set[tuple[str, int]] = set()
    for h in win.hits + [c.hits[0] for c in cands[1:] if c.hits]:
        if (h.file, h.line) not in seen and len(evidence) < MAX_EVIDENCE:
            seen.add((h.file, h.line))
            evidence.append(_ev(h, where))
    key = win.hits[0] if win.hits else None
    own = [h for h in win.hits if h.explained_by is None]
    # an explained GPU is a victim, not the suspect: the suspect GPU comes from the cause's own lines
    gpu = next((h.gpu for h in own if h.gpu), None)
    host = (key.host if key and key.host else None) or next((h.host for h in win.hits if h.host), None)
    device = key.device if key is not None else None
    return replace(
        base,
        category=win.category,
        group=group_of(win.category),
        confidence=round(confidence, 3),
        evidence=tuple(evidence),
        host=host or context_host,
        gpu=gpu,
        device=device,
        explanation="; ".join(n for n in notes if n),
        alternatives=tuple((c.category, round(c.confidence, 3)) for c in rivals),
    )


def _ev(h: Hit, where: dict[int, str]) -> EvidenceLine:
    cause = where.get(h.explained_by) if h.explained_by is not None else None
    return EvidenceLine(h.file, h.line, h.text, h.rule, h.category, cause)
