"""The cross-line analyses at work: the synthetic hits that `CrossLine` configurations add to a scan's hits (many
GPUs of a host lost in the same second, a sensor's jump, one diverging replica, a busy rank, a desync)."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from trainguard.classify.crossline import CrossLine
from trainguard.classify.nccl_releases import match, parse_version, show
from trainguard.classify.rules import Rule, RuleSet
from trainguard.classify.scan import Hit
from trainguard.classify.tiers import default_tier

log = logging.getLogger(__name__)

_KEY = re.compile(r"\b(?:step|iter(?:ation)?|batch)\s*[=:#]?\s*(\d+)", re.IGNORECASE)


def _synthetic(c: CrossLine, key: Hit, order: int, text: str, category: str = "", **kw: Any) -> Hit:
    category = category or c.category
    return replace(key, rule=c.id, category=category, confidence=c.confidence, tier=default_tier(category),
                   explain=f"{c.explain} ({text})" if text else c.explain, order=order, explained_by=None, **kw)


def _simultaneous(c: CrossLine, hits: list[Hit], by_cat: Mapping[str, list[Hit]], next_order: int,
                  strong: float) -> list[Hit]:
    lost = [h for h in hits if h.category in c.categories and (h.device or h.gpu) and h.time is not None]
    out: list[Hit] = []
    for host in sorted({h.host or "" for h in lost}):
        mine = sorted((h for h in lost if (h.host or "") == host), key=lambda h: h.time or ("", 0.0))
        for i, first in enumerate(mine):
            assert first.time is not None
            burst = [h for h in mine[i:] if h.time and h.time[0] == first.time[0]
                     and h.time[1] - first.time[1] <= c.within_s]
            devices = sorted({h.device or h.gpu or "" for h in burst})
            if len(devices) < c.min_devices:
                continue
            # only strong evidence of its own names another host-level component (a corrected PCIe error does not)
            category = next((p for p in c.prefer for h in by_cat.get(p, ())
                             if h.confidence >= strong and (not host or h.host is None or h.host == host)),
                            c.category)
            text = f"{len(devices)} devices within {c.within_s:g} s: {', '.join(devices[:8])}"
            # just before the first of them, so it explains all of them
            cause = _synthetic(c, first, next_order - len(out), text, category=category, gpu=None, device=None,
                               time=(first.time[0], first.time[1] - 1e-3))
            out.append(cause)
            break
    return out


def _value(rule: Rule, h: Hit, group: str) -> str | None:
    m = rule.pattern.search(h.text)
    return m.group(group) if m is not None else None


def _jumps(c: CrossLine, rule: Rule, series: list[Hit]) -> list[Hit]:
    rows: list[tuple[Hit, str, float]] = []
    for h in sorted(series, key=lambda h: h.order):
        sensor, value = _value(rule, h, "sensor"), _value(rule, h, "value")
        if "index" in rule.pattern.groupindex:  # one metric, many devices: the index is part of the name
            sensor = f"{sensor}[{_value(rule, h, 'index')}]"
        try:
            rows.append((h, sensor or "", float(value or "")))
        except ValueError:
            continue
    last: dict[str, tuple[Hit, float]] = {}
    for i, (h, sensor, v) in enumerate(rows):
        prev = last.get(sensor)
        last[sensor] = (h, v)
        if prev is None or v - prev[1] < c.min_rise:
            continue
        dt = (h.time[1] - prev[0].time[1]) if h.time and prev[0].time and h.time[0] == prev[0].time[0] else None
        if dt is not None and dt > c.within_s:
            continue  # a slow climb is heat, not a broken sensor
        # the others over the same span (and the readings just after it) must stay calm
        others = [(x, s, y) for x, s, y in rows[:i + 8] if s != sensor and x.order > prev[0].order]
        calm = True
        for x, s, y in others:
            before = next((yy for xx, ss, yy in reversed(rows[:rows.index((x, s, y))]) if ss == s), None)
            if before is not None and y - before >= c.calm:
                calm = False
        if calm:
            text = f"{sensor} {prev[1]:g} -> {v:g}" + (f" in {dt:g} s" if dt is not None else "") + \
                f"; {len({s for _, s, _ in others})} other sensor(s) steady"
            return [_synthetic(c, h, h.order, text)]
    return []


def _divergence(c: CrossLine, rule: Rule, series: list[Hit]) -> list[Hit]:
    tables: dict[str, dict[str, tuple[Hit, str]]] = {}
    for h in sorted(series, key=lambda h: h.order):
        replica, value = _value(rule, h, "replica"), _value(rule, h, "value")
        if replica is None or value is None:
            continue
        k = _KEY.search(h.text)
        tables.setdefault(k.group(1) if k else "", {})[replica] = (h, value.lower())
    out: list[Hit] = []
    for step, rows in tables.items():
        if len(rows) < c.min_replicas:
            continue
        counts = Counter(v for _, v in rows.values())
        major, n = counts.most_common(1)[0]
        if n != len(rows) - 1:
            continue  # all agree, or no single odd one out (nondeterminism is not one bad device)
        replica, (h, v) = next((r, hv) for r, hv in rows.items() if hv[1] != major)
        text = (f"replica {replica} reads {v} where the other {n} read {major}"
                + (f" at step {step}" if step else ""))
        out.append(_synthetic(c, h, h.order, text))
        break
    return out


# whose line it is: torch's "[rank3]:" / "[Rank 3]" and srun --label's "3: " give the global rank, torchrun's
# "[default3]:" the local one
_LINE_RANK = re.compile(r"\[(?:[Rr]ank|RANK) ?(\d+)\]|^\s*(\d{1,5}): |\[default(\d+)\]:")


def _line_rank(text: str) -> tuple[str, str] | None:
    """(``rank`` or ``local rank``, its number) of the process that printed ``text``, when the line says."""
    m = _LINE_RANK.search(text)
    if m is None:
        return None
    return ("local rank", m.group(3)) if m.group(3) else ("rank", m.group(1) or m.group(2))


def _busy(c: CrossLine, work: list[Hit], kept: list[Hit]) -> list[Hit]:
    waits = sorted((h for h in kept if h.category in c.categories), key=lambda h: h.order)
    if not waits:
        return []
    first = waits[0]
    before = [h for h in work if h.order < first.order and h.file == first.file]
    if not before:
        return []
    busy = max(before, key=lambda h: h.order)  # the work nearest before the first timeout
    if busy.time is not None and first.time is not None and busy.time[0] == first.time[0] \
            and first.time[1] - busy.time[1] > c.within_s:
        return []
    if c.within_lines and first.line - busy.line > c.within_lines:
        return []
    who = _line_rank(busy.text)
    waited = sorted({r[1] for h in waits if (r := _line_rank(h.text)) is not None and r != who}, key=int)
    shown = busy.text.rsplit("\r", 1)[-1].strip()[:120]  # a progress bar's last update
    text = (f"{who[0]} {who[1]}: " if who else "") + repr(shown)
    # the timeouts kept are the first few of the log: they name the first ranks to give up, not all of them
    text += (f", then the first timeouts came from rank{'s' if len(waited) > 1 else ''} {', '.join(waited[:8])}"
             if waited else f", then {len(waits)} timeout line(s)")
    return [_synthetic(c, busy, busy.order, text)]


def _desync(c: CrossLine, rule: Rule, rows: list[Hit]) -> list[Hit]:
    groups: dict[str, dict[str, tuple[Hit, tuple[str, str]]]] = {}
    for h in sorted(rows, key=lambda h: h.order):
        m = rule.pattern.search(h.text)
        if m is None:
            continue
        pg = (m.groupdict().get("pg") or "")
        groups.setdefault(pg, {}).setdefault(m.group("replica"), (h, (m.group("seq"), m.group("op"))))
    for pg, ranks in groups.items():
        if len(ranks) < 2 or len({w for _, w in ranks.values()}) < 2:
            continue
        seen = sorted(ranks.items(), key=lambda kv: kv[1][0].order)
        h = seen[0][1][0]
        text = "; ".join(f"rank {r} at {op} #{seq}" for r, (_, (seq, op)) in seen[:6])
        return [_synthetic(c, h, h.order, text + (f" (process group {pg})" if pg else ""))]
    return []


def _release(c: CrossLine, rule: Rule, versions: list[Hit], context: list[Hit], kept: list[Hit],
             order: int) -> list[Hit]:
    """A known-bad NCCL release named by a version line, when the log also shows a failure of its symptom."""
    seen = {symptom for symptom, ids in c.symptoms if any(h.rule in ids for h in kept)}
    if not seen:
        return []  # a version alone is no failure
    texts = [h.text for h in context]
    for h in sorted(versions, key=lambda h: h.order):
        version = parse_version(_value(rule, h, "version") or "")
        entry = match(version, seen, texts) if version is not None else None
        if entry is None:
            continue
        assert version is not None
        log.debug("%s: NCCL %s is %s", c.id, show(version), entry.id)
        # before every line (negative order, no time): it explains the symptom lines wherever the version was printed
        return [replace(h, rule=c.id, category=c.category, confidence=entry.confidence,
                        tier=default_tier(c.category), explain=entry.verdict(show(version)), order=order,
                        time=None, gpu=None, device=None, explained_by=None)]
    return []


def derive(hits: list[Hit], rules: RuleSet) -> list[Hit]:
    """``hits`` without the lines of readings rules, plus the hits every crossline analysis adds."""
    if not rules.crosslines:
        return hits
    by_id = {r.id: r for r in rules.rules}
    series_ids = {c.readings for c in rules.crosslines if c.readings} | {c.context for c in rules.crosslines
                                                                         if c.context}
    series: dict[str, list[Hit]] = {}
    kept: list[Hit] = []
    for h in hits:
        (series.setdefault(h.rule, []) if h.rule in series_ids else kept).append(h)
    by_cat: dict[str, list[Hit]] = {}
    for h in kept:
        by_cat.setdefault(h.category, []).append(h)
    added: list[Hit] = []
    for c in rules.crosslines:
        if c.kind == "simultaneous":
            added += _simultaneous(c, kept, by_cat, -1 - len(added), rules.strong_confidence)
        elif c.kind == "busy":
            added += _busy(c, series.get(c.readings, []), kept)
        elif c.kind == "release" and c.readings in series:
            added += _release(c, by_id[c.readings], series[c.readings], series.get(c.context, []), kept,
                              -1 - len(added))
        elif c.kind == "desync" and c.readings in series:
            added += _desync(c, by_id[c.readings], series[c.readings])
        elif c.readings in series:
            fn = _jumps if c.kind == "jump" else _divergence
            added += fn(c, by_id[c.readings], series[c.readings])
    for h in added:
        log.debug("%s: %s at %s:%d", h.rule, h.category, h.file, h.line)
    return kept + added
