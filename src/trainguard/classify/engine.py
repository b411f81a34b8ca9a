"""From collected hits to one verdict: precedence, confidence, evidence and the suspect."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from trainguard.classify.rules import RuleSet
from trainguard.classify.scan import Accumulator, Hit
from trainguard.classify.taxonomy import TIERS, UNKNOWN, group_of

MAX_EVIDENCE = 10
AMBIGUITY_FACTOR = 0.85
"""A winner's confidence is scaled by this when a strong rival of the same tier names another category."""


@dataclass(frozen=True)
class Evidence:
    """One log line that supports a classification."""

    file: str
    line: int
    """1-based line number in ``file`` (for JSON files: in the decoded text, see docs/classify.md)."""
    text: str
    rule: str = ""
    """Id of the rule (``xid-<code>`` for XIDs, ``verdict-<name>`` for localization verdicts)."""
    category: str = ""
    """What this line alone points to."""

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "text": self.text, "rule": self.rule,
                "category": self.category}


@dataclass(frozen=True)
class Classification:
    """The root cause of one source (a log file, a directory of logs, or a text)."""

    source: str
    category: str
    """Table 5 category, or ``Unknown``."""
    group: str
    """Table 5 group of the category (``Unknown`` for ``Unknown`` and NCCL watchdog timeouts)."""
    confidence: float
    evidence: tuple[Evidence, ...] = ()
    """The key line first, then more support, then the strongest line of each alternative."""
    host: str | None = None
    """Suspected host: from the key line's syslog prefix, else a torchelastic ``host :`` line."""
    gpu: str | None = None
    """Suspected GPU as its PCI bus id (from XID lines), if any."""
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

    def evidence_strings(self) -> tuple[str, ...]:
        """``file:line: text`` per evidence line, for `trainguard.events.Diagnosis.evidence` (the fleet
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
            "explanation": self.explanation,
            "alternatives": [{"category": c, "confidence": round(p, 3)} for c, p in self.alternatives],
            "xids": {str(k): v for k, v in sorted(self.xids.items())},
            "verdict": self.verdict,
            "lines": self.lines,
            "truncated_lines": self.truncated_lines,
            "files": self.files,
            "skipped": list(self.skipped),
        }


@dataclass
class _Candidate:
    category: str
    confidence: float
    tier: str
    hits: list[Hit]
    explain: str
    first: int


def _candidates(acc: Accumulator, rules: RuleSet, verdict: str | None) -> list[_Candidate]:
    yields = {r.id: r.yields_to for r in rules.rules if r.yields_to}
    own = {h.category for hits in acc.hits.values() for h in hits if h.rule not in yields}
    by_cat: dict[str, list[Hit]] = {}
    for hits in acc.hits.values():
        for h in hits:
            target = next((c for c in yields.get(h.rule, ()) if c in own), h.category)
            by_cat.setdefault(target, []).append(h if target == h.category else replace(h, category=target))
    out: list[_Candidate] = []
    for cat, hits in by_cat.items():
        hits.sort(key=lambda h: (-h.confidence, h.order))
        best = hits[0]
        distinct = len({h.rule for h in hits})
        conf = min(0.99, best.confidence + 0.05 * (distinct - 1))
        tier = min((h.tier for h in hits if h.confidence == best.confidence), key=TIERS.index)
        out.append(_Candidate(cat, conf, tier, hits, best.explain, min(h.order for h in hits)))
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
        notes = ["no rule names a cause; best partial evidence: " + win.explain]
    elif any(c.tier == win.tier and c.confidence >= strong for c in rivals) and win.confidence >= strong:
        confidence *= AMBIGUITY_FACTOR
        notes.append("other strong signals of the same kind are present (see alternatives)")
    elif rivals and win.tier != rivals[0].tier and rivals[0].confidence >= strong:
        notes.append(f"outranks {rivals[0].category} ({rivals[0].tier} signals yield to {win.tier} ones)")

    evidence: list[Evidence] = []
    seen: set[tuple[str, int]] = set()
    for h in win.hits + [c.hits[0] for c in cands[1:] if c.hits]:
        if (h.file, h.line) not in seen and len(evidence) < MAX_EVIDENCE:
            seen.add((h.file, h.line))
            evidence.append(_ev(h))
    key = win.hits[0] if win.hits else None
    gpu = next((h.gpu for h in win.hits if h.gpu), None)
    host = (key.host if key and key.host else None) or next((h.host for h in win.hits if h.host), None)
    return replace(
        base,
        category=win.category,
        group=group_of(win.category),
        confidence=round(confidence, 3),
        evidence=tuple(evidence),
        host=host or context_host,
        gpu=gpu,
        explanation="; ".join(n for n in notes if n),
        alternatives=tuple((c.category, round(c.confidence, 3)) for c in rivals),
    )


def _ev(h: Hit) -> Evidence:
    return Evidence(h.file, h.line, h.text, h.rule, h.category)
